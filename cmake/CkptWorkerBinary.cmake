# ckpt-worker: one process per device. Its sources use only the public headers
# of ckpt::model and ckpt::ipc, so they compile without LibTorch headers.
find_package(CLI11 REQUIRED)
add_library(ckpt_worker_loop STATIC ${PROJECT_SOURCE_DIR}/worker/src/worker_loop.cc)
target_link_libraries(ckpt_worker_loop PUBLIC ckpt::model ckpt::ipc ckpt::format Threads::Threads)
target_include_directories(ckpt_worker_loop PUBLIC ${PROJECT_SOURCE_DIR}/worker/include)
ckpt_set_defaults(ckpt_worker_loop)

add_executable(ckpt-worker ${PROJECT_SOURCE_DIR}/worker/src/worker_main.cc)
target_link_libraries(ckpt-worker PRIVATE ckpt_worker_loop CLI11::CLI11)
ckpt_set_defaults(ckpt-worker)
set_target_properties(ckpt-worker PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
