"""Cases for walk_row's batched tail (ptx/reduce.cu: a row thread's last < kUnroll units loaded together):
(name, A dims, C dims) of rows_vec problems whose lanes end with every tail count 0..3, shared by the CPU
check of the counts and the GPU test of the values."""
import numpy as np

from pydnn.ops import reduce as R

CASES = [
    ("2824 fp32 rows (the sweep's AVG shape, fewer rows)", (613, 2824), (613, 1)),  # 706 units, G 128: tails 2, 1
    ("901 units", (77, 3604), (77, 1)),        # G 128: q 8 / 7: tails 0, 3
    ("odd row, head and tail", (19, 1, 1, 2830), (19, 1, 1, 1)),
    ("short rows", (300, 37), (300, 1)),        # 9 units: G 2
    ("two dims", (6, 16, 7, 8), (1, 16, 1, 1)),  # N and H x W reduced: walk of two dims
    ("two dims longer", (40, 24, 10, 10), (1, 24, 1, 1)),
]


def tails(units, G):
    """The tail count (units left after the unrolled loop) of each lane of a group of G over `units`."""
    q = np.array([len(range(lane, units, G)) for lane in range(G)])
    return set((q % R.UNROLL).tolist())
