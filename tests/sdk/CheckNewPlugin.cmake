# Installs the build into a scratch prefix; for each kind (KINDS, default
# all) writes a project with the installed `trainer new-plugin`, configures
# it against the SDK, builds it and runs its ctest. Then checks that
# new-plugin refuses what it must, writing nothing.
#   cmake -DBUILD=<build dir> [-DKINDS=strategy;model] -P CheckNewPlugin.cmake
set(root "${BUILD}/test-tmp/new-plugin")
set(prefix "${root}/prefix")
file(REMOVE_RECURSE "${root}")
if(NOT KINDS)
  set(KINDS strategy model dataset logger comm optimizer)
endif()
include("${CMAKE_CURRENT_LIST_DIR}/Step.cmake")
step(${CMAKE_COMMAND} --install "${BUILD}" --prefix "${prefix}")
set(trainer "${prefix}/bin/trainer")

# Each project is named after its kind ("strategy", "model", ...): the SDK
# declares a type of that name, which the generated class must not be.
foreach(kind IN LISTS KINDS)
  set(project "${root}/${kind}")
  step("${trainer}" new-plugin ${kind} ${kind} "${project}/")
  file(GLOB sources "${project}/src/*.cpp")
  if(NOT sources OR NOT EXISTS "${project}/CMakeLists.txt" OR NOT EXISTS "${project}/README.md")
    message(FATAL_ERROR "new-plugin ${kind} wrote no project:\n${output}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${project}" -B "${project}/build" "-DCMAKE_PREFIX_PATH=${prefix};${PREFIX_PATH}"
                  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "configuring the ${kind} project against the SDK failed:\n${out}\n${err}")
  endif()
  step(${CMAKE_COMMAND} --build "${project}/build" -j 2)
  step(${CMAKE_CTEST_COMMAND} --test-dir "${project}/build" --output-on-failure)
  message(STATUS "${kind}: built and passed its tests")
endforeach()

# Refusals: a directory in the way (left as it was), an unknown kind, a name
# recipes cannot write.
list(GET KINDS 0 kind)
file(WRITE "${root}/${kind}/README.md" "kept\n")
foreach(arguments "${kind};other;${root}/${kind}" "widget;w;${root}/w" "logger;My_Logger;${root}/x")
  execute_process(COMMAND "${trainer}" new-plugin ${arguments} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(code EQUAL 0 OR NOT "${out}${err}" MATCHES "new-plugin: ")
    message(FATAL_ERROR "new-plugin ${arguments} was not refused with a reason (${code}):\n${out}\n${err}")
  endif()
endforeach()
file(READ "${root}/${kind}/README.md" kept)
if(NOT kept STREQUAL "kept\n" OR EXISTS "${root}/w" OR EXISTS "${root}/x")
  message(FATAL_ERROR "a refused new-plugin wrote something")
endif()
