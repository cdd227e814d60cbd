"""The LoRA differential test's peer (crates/r2vpo-llm/tests/lora_peft.rs):
Hugging Face PEFT on transformers, on the CPU in float32.

  apply  BASE ADAPTER IDS OUT  load BASE with the PEFT adapter ADAPTER and
                               write the log-probs of each row's next tokens
  create BASE ADAPTER IDS OUT R ALPHA TARGETS RSLORA SEED
                               make a PEFT adapter on BASE (A and B both
                               random: init_lora_weights=False), save it
                               to ADAPTER, and write the same log-probs

IDS is rows of token ids, `;` between rows and `,` inside one (equal
lengths, no padding). OUT gets {"logprobs": [[...], ...]}: row r, column t
is log p(ids[r][t+1] | ids[r][:t+1]).
"""
import json
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM


def logprobs(model, ids):
    x = torch.tensor(ids, dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=x).logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1)
    return lp.gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1).tolist()


def main():
    mode, base, adapter, ids, out = sys.argv[1:6]
    ids = [[int(t) for t in row.split(",")] for row in ids.split(";")]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if mode == "apply":
        model = PeftModel.from_pretrained(model, adapter)
    elif mode == "create":
        r, alpha, targets, rslora, seed = sys.argv[6:11]
        torch.manual_seed(int(seed))
        cfg = LoraConfig(
            r=int(r),
            lora_alpha=float(alpha),
            target_modules=targets.split(","),
            use_rslora=rslora == "1",
            lora_dropout=0.0,
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, cfg)
        model.save_pretrained(adapter)
    else:
        sys.exit(f"unknown mode {mode}")
    model.eval()
    with open(out, "w") as f:
        json.dump({"logprobs": logprobs(model, ids)}, f)


if __name__ == "__main__":
    main()
