#!/usr/bin/env bash
# Compiler launcher for the stages' CUDA sources: runs the compile and fails it when ptxas reports
# a "Potential Performance Loss" (wgmma products serialised, by register pressure or by a branch
# around them) or one of the codes C7508-C7515 (also register moves ignored). ptxas prints those
# as "info", which -Xptxas=-Werror does not turn into errors.
out=$("$@" 2>&1)
rc=$?
[ -n "$out" ] && printf '%s\n' "$out" >&2
if [ $rc -eq 0 ] && grep -qE 'Potential Performance Loss|\(C75(0[89]|1[0-5])\)' <<<"$out"; then
  echo "error: ptxas serialised wgmma or ignored a register move (the C75xx lines above)" >&2
  exit 1
fi
exit $rc
