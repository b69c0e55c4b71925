"""Float64 references for the tensor ops (cuDNN semantics; broadcasting by numpy's rules, which match
cuDNN's 'equal or 1' rule for tensors of the same rank)."""
import numpy as np

from .. import enums as E


def op_tensor(op, alpha1, a, alpha2, b, beta, c0, propagate_nan=False):
    x = alpha1 * np.asarray(a, np.float64)
    y = None if b is None else alpha2 * np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):
        if op == E.PYDNN_OP_TENSOR_ADD:
            r = x + y
        elif op == E.PYDNN_OP_TENSOR_MUL:
            r = x * y
        elif op in (E.PYDNN_OP_TENSOR_MIN, E.PYDNN_OP_TENSOR_MAX):
            f = (np.minimum if propagate_nan else np.fmin) if op == E.PYDNN_OP_TENSOR_MIN else \
                (np.maximum if propagate_nan else np.fmax)
            r = f(x, np.broadcast_to(y, x.shape))
        elif op == E.PYDNN_OP_TENSOR_SQRT:
            r = np.sqrt(x)
        elif op == E.PYDNN_OP_TENSOR_NOT:
            r = 1.0 - x
        else:
            raise ValueError(op)
    return r if beta == 0 else r + beta * np.asarray(c0, np.float64)


def scaled(alpha, a, beta, c0):
    """AddTensor / ScaleTensor / TransformTensor: alpha * a + beta * c."""
    r = alpha * np.asarray(a, np.float64)
    return r if beta == 0 else r + beta * np.asarray(c0, np.float64)
