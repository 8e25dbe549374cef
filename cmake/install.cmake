# cmake --install: lib/libggml-rocmforge.so.<version> with its soname link (.so.<major>) and
# link-time name (.so), include/ggml-rocmforge.h, the CMake package (lib/cmake/rocmforge) and
# lib/pkgconfig/rocmforge.pc. ggml's own install rules put its headers, libggml and
# libggml-base in lib/ and include/ (with lib/cmake/ggml), and libggml-cpu.so in bin/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_rf_file libggml-rocmforge.so.${GGML_ROCMFORGE_VERSION})
set(_rf_links ${CMAKE_BINARY_DIR}/install-links)
file(MAKE_DIRECTORY ${_rf_links})
file(CREATE_LINK ${_rf_file} ${_rf_links}/libggml-rocmforge.so.${ROCMFORGE_SOVERSION} SYMBOLIC)
file(CREATE_LINK libggml-rocmforge.so.${ROCMFORGE_SOVERSION} ${_rf_links}/libggml-rocmforge.so SYMBOLIC)
install(FILES ${ROCMFORGE_LIB} DESTINATION ${CMAKE_INSTALL_LIBDIR} RENAME ${_rf_file})
install(FILES ${_rf_links}/libggml-rocmforge.so.${ROCMFORGE_SOVERSION} ${_rf_links}/libggml-rocmforge.so
        DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/ggml-rocmforge.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(_rf_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/rocmforge)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/rocmforgeConfig.cmake.in
    ${CMAKE_BINARY_DIR}/rocmforgeConfig.cmake
    INSTALL_DESTINATION ${_rf_cmake_dir}
    PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
# 0.x: a minor release may change the C API, so only the same major.minor is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/rocmforgeConfigVersion.cmake
    VERSION ${GGML_ROCMFORGE_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/rocmforgeConfig.cmake ${CMAKE_BINARY_DIR}/rocmforgeConfigVersion.cmake
        DESTINATION ${_rf_cmake_dir})

# pkg-config: ggml installs no .pc file when built inside llama.cpp, so its libraries are named here.
# The prefix is found from the file's own place, so `cmake --install --prefix P` needs nothing more.
file(RELATIVE_PATH _rf_pc_up /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" _rf_pc_up "${_rf_pc_up}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/rocmforge.pc.in ${CMAKE_BINARY_DIR}/rocmforge.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/rocmforge.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
