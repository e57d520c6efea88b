# The ABI guard: the SDK headers (comments and whitespace removed) must have
# the digest core/include/trainer/abi-digest.txt records for the kAbiVersion
# that Plugin.h declares. A change to a header fails this until the version
# is bumped and a line "VERSION DIGEST" appended for it.
#   cmake -DSOURCE=<project root> -P CheckAbi.cmake
set(include_dir "${SOURCE}/core/include/trainer")
# The interface tier only (trainer/*.h): the building blocks (sharding/),
# utilities (util/) and ops (ops/) are functions and classes of
# libtrainer_core.so that a plugin links against, not the descriptor and
# the virtual interfaces the loader checks.
file(GLOB headers RELATIVE "${include_dir}" "${include_dir}/*.h")
list(SORT headers)
set(text "")
foreach(header IN LISTS headers)
  file(READ "${include_dir}/${header}" content)
  string(REGEX REPLACE "//[^\n]*" "" content "${content}")
  string(REGEX REPLACE "[ \t\r\n]+" "" content "${content}")
  string(APPEND text "${header}:${content};")
endforeach()
string(SHA256 digest "${text}")
file(READ "${include_dir}/Plugin.h" plugin)
string(REGEX MATCH "kAbiVersion = ([0-9]+);" _ "${plugin}")
set(version "${CMAKE_MATCH_1}")
file(STRINGS "${include_dir}/abi-digest.txt" lines REGEX "^[0-9]+ [0-9a-f]+$")
set(previous 0)
set(recorded "")
foreach(line IN LISTS lines)
  string(REPLACE " " ";" fields "${line}")
  list(GET fields 0 v)
  list(GET fields 1 d)
  if(NOT v GREATER previous)
    message(FATAL_ERROR "abi-digest.txt: versions must increase line by line (${v} after ${previous})")
  endif()
  set(previous ${v})
  if(v EQUAL version)
    set(recorded "${d}")
  endif()
endforeach()
if(NOT previous EQUAL version)
  message(FATAL_ERROR "abi-digest.txt ends at version ${previous}, Plugin.h declares kAbiVersion = ${version}")
endif()
if(NOT recorded STREQUAL digest)
  math(EXPR next "${version} + 1")
  message(FATAL_ERROR "The SDK headers changed since kAbiVersion ${version} was recorded: an old plugin binary would "
                      "load into this trainer and crash. Set kAbiVersion = ${next} in Plugin.h and append the line\n"
                      "${next} ${digest}\nto core/include/trainer/abi-digest.txt")
endif()
message(STATUS "SDK headers match kAbiVersion ${version} (${digest})")
