import torch
from torch import nn
from transformers import AttentionInterface
from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward, repeat_kv
MAXK = 32
def par_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    if not torch.compiler.is_compiling() or key.shape[-2] > MAXK or (dropout and module.training):
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kw)
    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    s = (query[:, :, :, None, :] * key[:, :, None, :, :]).sum(-1) * scaling
    if attention_mask is not None: s = s + attention_mask
    p = nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    out = (p[..., None] * value[:, :, None, :, :]).sum(-2)
    return out.transpose(1, 2).contiguous(), p
AttentionInterface.register("par_eager", par_eager)
