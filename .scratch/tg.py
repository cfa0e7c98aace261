import os
import numpy as np, cupy as cp, rnngrad as rg
from rnngrad.backends.metal.host import cuda_device
shapes=((100,32,256,256),(50,1,64,64),(200,64,512,512),(1000,8,128,128))
print("cell shape cap: fwd_ms bwd_ms gemm_ms")
for T,N,I,H in shapes:
    for cell,G in (("single_gate",1),("gru",3),("lstm",4)):
        rng=np.random.default_rng(0)
        x=cp.asarray(rng.standard_normal((T,N,I)).astype(np.float32)); W=cp.asarray((rng.standard_normal((G*H,I))/np.sqrt(I)).astype(np.float32))
        R=cp.asarray((rng.standard_normal((G*H,H))/np.sqrt(H)).astype(np.float32)); b=cp.zeros(G*H,np.float32); dh=cp.ones((T,N,H),np.float32)
        if cell=="lstm":
            d=rg.LSTMDescriptor(training=True)
            def step():
                h,c,z=rg.lstm(x,R,W,b,descriptor=d,backend="metal-cuda"); rg.lstm_gradients(x,R,dh,z,c,input_weight=W,bias=b,descriptor=d,backend="metal-cuda")
        elif cell=="gru":
            d=rg.GRUDescriptor(training=True,reset_gate_first=True,reset_after=True)
            def step():
                h,z=rg.gru(x,R,W,b,descriptor=d,backend="metal-cuda"); rg.gru_gradients(x,R,dh,z,h,input_weight=W,bias=b,descriptor=d,backend="metal-cuda")
        else:
            d=rg.SingleGateRNNDescriptor(training=True,activation="tanh")
            def step():
                h,z=rg.single_gate_rnn(x,R,W,b,descriptor=d,backend="metal-cuda"); rg.single_gate_rnn_gradients(x,R,dh,z,input_weight=W,bias=b,descriptor=d,backend="metal-cuda")
        ref=None
        for cap in ('packed','rows'):
            os.environ['RNNGRAD_METAL_RECURRENCE']=cap
            with cuda_device() as dev:
                step(); step(); cp.cuda.Device().synchronize(); dev.trace.clear(); step(); cp.cuda.Device().synchronize()
                f=sum(t.seconds for t in dev.trace if t.kernel.endswith("forward"))*1e3
                bk=sum(t.seconds for t in dev.trace if t.kernel.endswith("backward"))*1e3
                g=sum(t.seconds for t in dev.trace if t.kernel.startswith("strided"))*1e3
                print(f"{cell} {T}x{N}x{I}x{H} {cap}: {f:.3f} {bk:.3f} {g:.3f}", flush=True)
