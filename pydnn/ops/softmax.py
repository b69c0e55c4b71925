def kernel_units():
    return []
