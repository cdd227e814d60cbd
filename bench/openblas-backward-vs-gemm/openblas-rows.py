import ctypes, numpy as np
lib = ctypes.CDLL("/work/main/.deps/openblas/lib/libscipy_openblas.so")
lib.scipy_openblas_set_num_threads(1)
f = lib.scipy_cblas_sgemm
P = ctypes.POINTER(ctypes.c_float)
def mm(a, b, tb=True):  # a (m,k) row-major, b (n,k) -> a b^T
    m, k = a.shape; n = b.shape[0]
    c = np.empty((m, n), np.float32)
    f(101, 111, 112 if tb else 111, m, n, k, ctypes.c_float(1.0), a.ctypes.data_as(P), k, b.ctypes.data_as(P), k, ctypes.c_float(0.0), c.ctypes.data_as(P), n)
    return c
rng = np.random.default_rng(0)
for (k, n) in [(576, 576), (576, 960), (1536, 576), (576, 320), (576, 256)]:
    a = rng.standard_normal((400, k)).astype(np.float32); b = rng.standard_normal((n, k)).astype(np.float32)
    full = mm(a, b)
    bad = []
    for m in [1, 7, 16, 33, 40, 64, 100, 160, 200]:
        part = mm(np.ascontiguousarray(a[:m]), b)
        if not np.array_equal(part, full[:m]): bad.append((m, float(np.abs(part-full[:m]).max())))
    # column split
    c1 = mm(a, np.ascontiguousarray(b[:n//2])); 
    colok = np.array_equal(c1, full[:, :n//2])
    print(k, n, "row-dependent m:", bad, "col split same:", colok)
# full 64-row blocks at different offsets
a = rng.standard_normal((400, 576)).astype(np.float32); b = rng.standard_normal((576, 576)).astype(np.float32)
x = mm(np.ascontiguousarray(a[0:64]), b); y = mm(np.ascontiguousarray(a[32:96]), b)
print("offset blocks same:", np.array_equal(x[32:64], y[0:32]))
print("same call twice same:", np.array_equal(mm(a, b), mm(a, b)))
