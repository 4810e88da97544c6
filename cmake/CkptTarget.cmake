# ckpt_set_defaults(TARGET): the project's own compile settings for one target.
# Warnings are errors in ckpt's own code only; third-party headers come in as SYSTEM.
function(ckpt_set_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_17)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Werror)
endfunction()
