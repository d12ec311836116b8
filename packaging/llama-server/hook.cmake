# Injected into llama-cpp-python's own CMake build (CMAKE_ARGS, see the Makefile) so that
# one compile of its vendored llama.cpp yields both the Python package's shared libraries
# and `llama-server`. CMake includes this file right after the vendored tree's
# `project("llama.cpp")`, in that tree's scope (PROJECT_SOURCE_DIR is its root).
# The server links the libraries the wheel ships (libllama, libggml*, libmtmd) and the
# common library that build makes anyway, so only tools/server itself is compiled on top.
# (CMake allows no add_subdirectory in a deferred call, so the server's folder is added
# here, before the tree's own targets: target names are resolved at generation.)
if(PROJECT_NAME STREQUAL "llama.cpp" AND NOT LLAMAD_SERVER_HOOKED)
    set(LLAMAD_SERVER_HOOKED TRUE)
    add_subdirectory("${CMAKE_CURRENT_LIST_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/llamad-server")
    include("${CMAKE_CURRENT_LIST_DIR}/no-amx.cmake")
endif()

