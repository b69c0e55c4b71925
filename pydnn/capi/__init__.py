"""pydnn's C face: libpydnn.so and include/pydnn.h, both generated from one declaration.

- decl.py declares the C API once: the enums and #defines of pydnn/enums.py, the opaque handle and
  descriptor types, and every prototype (cuDNN 9's argument lists under pydnn names) with a one-line
  description. tools/gen_header.py writes include/pydnn.h from it; a test fails when the header is stale.
- library.py builds libpydnn.so with cffi's embedding API into <cache>/lib/<python>-<location>/, rebuilt
  only when the declaration, the glue or the Python changes. A C program's first pydnn call starts an
  embedded Python interpreter that imports this pydnn package (its location and import path are baked in).
- impl.py defines every C function from its prototype: arguments are converted by their C types (opaque
  pointers -> the live Python objects, `const void *alpha/beta` -> double for DOUBLE outputs else float,
  device pointers and streams -> ints, out-pointers checked non-NULL first and written after the call) and
  passed to pydnn.<snake_case name>; a PydnnError becomes its status, any other exception INTERNAL_ERROR,
  and the message is kept for pydnnGetLastErrorString.
- `cc prog.c $(python -m pydnn config --cflags --libs)` compiles and links a C program (config_flags).
"""
