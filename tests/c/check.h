/* The line protocol of the C test programs: one "ok <what>" or "FAIL <what> (line N)" line per check, read
 * by their pytest wrappers; `failures` counts the FAIL lines for the exit status. */
#ifndef PYDNN_TEST_CHECK_H
#define PYDNN_TEST_CHECK_H
#include <stdio.h>

static int failures = 0;
#define CHECK(cond, what)                                              \
  do {                                                                 \
    if (cond) printf("ok %s\n", what);                                 \
    else { printf("FAIL %s (line %d)\n", what, __LINE__); failures++; } \
  } while (0)
#endif
