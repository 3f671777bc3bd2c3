"""A short training on the lake with PyTorch's memory history on: writes the
memory_viz snapshot ($OUT/train_snapshot.pickle, open it at
pytorch.org/memory_viz) and torch.cuda.memory_summary() ($OUT/memory_summary.txt)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gmlake  # noqa: E402

gmlake.enable(mode=os.environ.get("GMLAKE_MODE") or None)
out = os.environ.get("OUT", "/tmp")
torch.cuda.memory._record_memory_history(max_entries=200000)
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=256)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(6):
    x = torch.randint(0, 8192, (8, 256), device="cuda")
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(os.path.join(out, "train_snapshot.pickle"))
# what memory_viz will meet replaying it (tools/memviz_check.py), and its reserved against PyTorch's
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import memviz_check  # noqa: E402

snap_stats = {}
problems = memviz_check.check(torch.cuda.memory._snapshot(), stats=snap_stats)
print("memviz_check:", snap_stats, "memory_reserved:", torch.cuda.memory_reserved(),
      "problems: %d" % len(problems), *problems[:10], sep="\n  ")
s = torch.cuda.memory_summary()
with open(os.path.join(out, "memory_summary.txt"), "w") as f:
    f.write(s)
print(s)
print("gmlake.stats():", gmlake.stats())
