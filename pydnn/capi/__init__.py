"""pydnn's C face.

decl.py declares the C API once (prototypes + the enums of pydnn/enums.py); tools/gen_header.py writes
include/pydnn.h from it, and library.py builds libpydnn.so with cffi's embedding API: a C caller's first
call starts an embedded Python interpreter that imports pydnn, and impl.py marshals each C call to the
Python function of the same name, returning the PydnnError's status on failure. `python -m pydnn config
--cflags --libs` prints the compiler flags.
"""
