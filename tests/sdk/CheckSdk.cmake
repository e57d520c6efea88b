# Installs the build into a scratch prefix, builds tests/sdk/example against
# it, and runs the installed trainer with the new plugin. Fails on any step.
#   cmake -DBUILD=<build dir> -DSOURCE=<source dir> -P CheckSdk.cmake
set(prefix "${BUILD}/test-tmp/sdk/prefix")
set(example "${BUILD}/test-tmp/sdk/example")
file(REMOVE_RECURSE "${BUILD}/test-tmp/sdk")
include("${CMAKE_CURRENT_LIST_DIR}/Step.cmake")
step(${CMAKE_COMMAND} --install "${BUILD}" --prefix "${prefix}")
# Called directly: forwarding through step() would split the path list.
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE}/tests/sdk/example" -B "${example}"
                        "-DCMAKE_PREFIX_PATH=${prefix};${PREFIX_PATH}"
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "configuring the example against the SDK failed:\n${out}\n${err}")
endif()
step(${CMAKE_COMMAND} --build "${example}")
step("${prefix}/bin/trainer" --plugin-dir "${example}/plugins" plugins)
if(NOT output MATCHES "logger +print +1.0")
  message(FATAL_ERROR "the installed trainer does not list the plugin:\n${output}")
endif()
if(NOT output MATCHES "${prefix}/lib/trainer/plugins/trainer-strategy-ddp.so")
  message(FATAL_ERROR "the installed trainer does not find its own plugins:\n${output}")
endif()
file(WRITE "${BUILD}/test-tmp/sdk/recipe.toml" "[run]\noutput_dir = '${BUILD}/test-tmp/sdk/run'\n[model]\nname = 'qwen2'\n[dataset]\nname = 'synthetic'\n[training]\nsteps = 4\n[[logger]]\nname = 'print'\nevery = 2\n")
step("${prefix}/bin/trainer" --plugin-dir "${example}/plugins" run "${BUILD}/test-tmp/sdk/recipe.toml")
if(NOT output MATCHES "print: step 2 loss [0-9.]+\nprint: step 4 loss")
  message(FATAL_ERROR "the plugin did not log:\n${output}")
endif()
