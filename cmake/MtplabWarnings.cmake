# Warnings on and clean: mtplab_warnings is linked by every mtplab target.
add_library(mtplab_warnings INTERFACE)
target_compile_options(mtplab_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
                            -Wunused -Woverloaded-virtual -Wimplicit-fallthrough
                            $<$<BOOL:${MTPLAB_WERROR}>:-Werror>>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr -lineinfo
                             $<$<BOOL:${MTPLAB_WERROR}>:-Werror=all-warnings>>)
