"""GPU activity: device records (kernels, copies, fills) with the Python stack that launched them."""
