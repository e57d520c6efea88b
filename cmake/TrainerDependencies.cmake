# Finds the project's dependencies: LibTorch, Boost (headers: Boost.DLL),
# TOML++, spdlog, CLI11, GoogleTest. Header-only libraries without a CMake
# package on some machines (TOML++, CLI11 on the GPU host) fall back to a
# plain header search, so `-DCMAKE_PREFIX_PATH=.deps` works there.
find_package(Torch REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(spdlog REQUIRED)
find_package(Threads REQUIRED)

function(trainer_header_only target header)
  if(TARGET ${target})
    return()
  endif()
  find_path(_dir "${header}" REQUIRED)
  add_library(${target} INTERFACE IMPORTED GLOBAL)
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dir}")
  unset(_dir CACHE)
endfunction()

find_package(tomlplusplus QUIET)
trainer_header_only(tomlplusplus::tomlplusplus toml++/toml.h)
find_package(CLI11 QUIET)
trainer_header_only(CLI11::CLI11 CLI/CLI.hpp)
# xxHash, used header-only (XXH_INLINE_ALL): Debian's libxxhash-dev here, .deps on the GPU host.
trainer_header_only(xxhash::xxhash xxhash.h)
# nlohmann-json: the JSON reader and writer (Debian nlohmann-json3-dev; .deps on the GPU host).
find_package(nlohmann_json 3.9 QUIET)
trainer_header_only(nlohmann_json::nlohmann_json nlohmann/json.hpp)

# The tokenizer (core/src/text): PCRE2 for the pre-tokenizer's Unicode
# patterns, utf8proc for NFC (Debian libpcre2-dev, libutf8proc-dev). Found by
# header and library on CMAKE_PREFIX_PATH too, as the GPU host needs
# (bench/stage-gpu-libs.sh stages them under .deps). Without them the trainer
# builds and Tokenizer::load says what is missing.
find_path(TRAINER_PCRE2_INCLUDE pcre2.h)
find_library(TRAINER_PCRE2_LIBRARY pcre2-8)
find_path(TRAINER_UTF8PROC_INCLUDE utf8proc.h)
find_library(TRAINER_UTF8PROC_LIBRARY utf8proc)
set(TRAINER_HAS_TOKENIZER OFF)
if(TRAINER_PCRE2_INCLUDE AND TRAINER_PCRE2_LIBRARY AND TRAINER_UTF8PROC_INCLUDE AND TRAINER_UTF8PROC_LIBRARY)
  set(TRAINER_HAS_TOKENIZER ON)
  add_library(trainer_text_libs INTERFACE)
  target_include_directories(trainer_text_libs SYSTEM INTERFACE ${TRAINER_PCRE2_INCLUDE} ${TRAINER_UTF8PROC_INCLUDE})
  target_link_libraries(trainer_text_libs INTERFACE ${TRAINER_PCRE2_LIBRARY} ${TRAINER_UTF8PROC_LIBRARY})
endif()
message(STATUS "trainer: tokenizer (PCRE2, utf8proc) ${TRAINER_HAS_TOKENIZER}")

# CUDA parts (the nccl backend, GPU tests) follow LibTorch unless told otherwise.
set(TRAINER_HAS_CUDA OFF)
if(TRAINER_CUDA STREQUAL "AUTO")
  if(TARGET torch_cuda OR CUDA_FOUND)
    set(TRAINER_HAS_CUDA ON)
  endif()
elseif(TRAINER_CUDA)
  set(TRAINER_HAS_CUDA ON)
endif()
# The project's own kernels (core/src/ops/*.cu) need nvcc; Hopper by default.
if(TRAINER_HAS_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()
message(STATUS "trainer: LibTorch ${Torch_VERSION}, CUDA parts ${TRAINER_HAS_CUDA}")
