"""Fused attention on Hopper wgmma (sm_90a units): placeholder, being written this session. It declares no
kernel units yet; pydnn/ops/attention.py does not call it."""


def kernel_units():
    return []
