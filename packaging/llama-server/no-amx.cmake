# No AMX kernels: ggml's AMX matrix multiply (ggml_backend_amx_mul_mat) segfaults at the
# first decode of every quantized model on the Sapphire Rapids VMs this is built and tested
# on, although the kernel grants the tile state (arch_prctl ARCH_REQ_XCOMP_PERM succeeds);
# f16 models, which it does not handle, run. GGML_NATIVE compiles with -march=native, which
# turns AMX on wherever the CPU has it; an explicit -mno-amx-* wins over -march whatever
# their order. Set LLAMAD_GGML_AMX=ON (CMAKE_ARGS) to keep them where they work.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND NOT LLAMAD_GGML_AMX)
    add_compile_options(-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
endif()
