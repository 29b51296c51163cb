import sys, time, statistics, os
sys.path.insert(0, '/work/main')
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
torch.set_num_threads(2)
class Old(ParLoopedQwenForStateTracking):
    def compile_core(self, **kw):
        super().compile_core(**kw)
        from modeling_par.modeling_par import default_compile_options
        self._old_coda = torch.compile(self._coda_block, **default_compile_options({}, self.device))
        return self
    def _readout_batch(self, inputs):
        x, mask, cos, sin, span, columns = inputs[0]
        hidden = self._old_coda(x, mask, cos, sin)[:, span:]
        at_queries = hidden.gather(1, columns[..., None].expand(-1, -1, hidden.shape[-1]))
        answer_rows, halt_rows = self._candidate_rows(self.lm_head.weight.device)
        answers = F.linear(at_queries, self.lm_head.weight[answer_rows]).chunk(len(inputs))
        halts = F.linear(at_queries[:, -1], self.lm_head.weight[halt_rows]).chunk(len(inputs))
        return list(zip(answers, halts))
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
mode=sys.argv[1]
runs={}; outs={}
for name,cls in (("old",Old),("new",ParLoopedQwenForStateTracking)):
    m=cls.from_pretrained(C,dtype=torch.float32,attn_implementation="par_eager").eval()
    m.compile_core()
    run=lambda m=m: evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode=mode,batch_size=256,progress=False)
    t=time.perf_counter(); r=run(); print(name,"first s",round(time.perf_counter()-t,1), r['accuracy'], r['per_depth'][0]['mean_iterations'], flush=True)
    runs[name]=run
res={k:[] for k in runs}
for _ in range(int(sys.argv[2])):
    for k,f in runs.items():
        t=time.perf_counter(); f(); res[k].append(time.perf_counter()-t)
for k,v in res.items(): print(k, f"{statistics.median(v):.3f} s", [round(x,3) for x in v])
