// libFuzzer's entry for programs that have their own main (SwiftPM gives every executable
// one): it parses libFuzzer's flags and runs `callback` on each input. Linked in only when
// building with -sanitize=fuzzer; declared here so Swift can call it.
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
