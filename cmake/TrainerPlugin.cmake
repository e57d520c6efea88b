# trainer_add_plugin(<target> KIND <kind> NAME <name> SOURCES ... [TORCH])
#
# Builds one plugin as a loadable module named trainer-<kind>-<name>.so into
# build/lib/trainer/plugins (the directory the core searches by default) and
# installs it into lib/trainer/plugins. TORCH marks a plugin whose sources
# include LibTorch headers: in this tree it reuses the core's precompiled
# header. Against an installed SDK (find_package(trainer)) plugins land in
# TRAINER_PLUGIN_OUTPUT_DIR, by default <build>/plugins.
function(trainer_add_plugin target)
  cmake_parse_arguments(P "TORCH" "KIND;NAME" "SOURCES" ${ARGN})
  if(NOT P_KIND OR NOT P_NAME OR NOT P_SOURCES)
    message(FATAL_ERROR "trainer_add_plugin(${target}): KIND, NAME and SOURCES are required")
  endif()
  if(NOT TRAINER_PLUGIN_OUTPUT_DIR)
    set(TRAINER_PLUGIN_OUTPUT_DIR "${CMAKE_BINARY_DIR}/plugins")
  endif()
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE trainer::core)
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "trainer-${P_KIND}-${P_NAME}"
    LIBRARY_OUTPUT_DIRECTORY "${TRAINER_PLUGIN_OUTPUT_DIR}"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN/../..")
  if(P_TORCH AND TARGET trainer_pch)
    target_precompile_headers(${target} REUSE_FROM trainer_pch)
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}/trainer/plugins")
endfunction()
