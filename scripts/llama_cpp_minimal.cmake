# Included right after llama.cpp's project() (CMAKE_PROJECT_llama.cpp_INCLUDE) when pip builds
# llama-cpp-python: skip llama.cpp's `common` library, which llama-cpp-python forces on but its Python
# package never loads (56 of 127 objects: chat parsers, an HTTP client).
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
# No AMX kernels: on the x86 VMs this project runs on, llama.cpp's AMX buffer type (chosen whenever the
# build host has AMX) computes garbage at ~0.5 token/s or crashes the process; the AVX-512 kernels are
# right. GCC and Clang honour an explicit -mno-* whatever -march=native comes after it.
if (CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  foreach(lang C CXX)
    string(APPEND CMAKE_${lang}_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  endforeach()
endif()
