import os, time, sys
import numpy as np
tot=[0,0]
def tm(f, flop, reps=3):
    f(); t=time.perf_counter()
    for _ in range(reps): f()
    s=(time.perf_counter()-t)/reps; return flop/s/1e9, s
n=2048; a=np.random.rand(n,n).astype(np.float32); b=np.random.rand(n,n).astype(np.float32)
print("2048^3: %.1f GFLOP/s"%max(tm(lambda: a@b, 2*n**3)[0] for _ in range(3)))
for k,nn in [(576,960),(576,576),(576,3072),(1536,576),(576,49152)]:
    m=2048 if nn==49152 else 2400
    x=np.random.rand(m,k).astype(np.float32); w=np.random.rand(nn,k).astype(np.float32); g=np.random.rand(m,nn).astype(np.float32)
    fl=2.0*m*nn*k; line=f"{m}x{k}x{nn}:"
    for name,f in [("fwd",lambda: x@w.T),("dx",lambda: g@w),("dw",lambda: g.T@x)]:
        r,s=tm(f,fl); tot[0]+=fl; tot[1]+=s; line+=f"  {name} {r:6.1f}"
    print(line)
print("all: %.1f"%(tot[0]/tot[1]/1e9))
