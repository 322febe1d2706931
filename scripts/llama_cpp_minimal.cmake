# Included right after llama.cpp's project() (CMAKE_PROJECT_llama.cpp_INCLUDE) when pip builds
# llama-cpp-python: skip llama.cpp's `common` library, which llama-cpp-python forces on but its Python
# package never loads (56 of 127 objects: chat parsers, an HTTP client).
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
