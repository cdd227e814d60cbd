// libtorch's fused AdamW (`at::_fused_adamw_`, what `torch.optim.AdamW(fused=True)`
// runs: one kernel over every parameter on CUDA, a vectorised loop on the
// CPU) for the torch backend. tch-rs exposes neither the fused nor the
// foreach form, and a step of per-parameter tensor ops costs ~8 kernel
// launches per parameter (≈ 2,500 for Qwen3-1.7B's 311 tensors).
//
// Tensors arrive as tch-rs's handles (`torch::Tensor *`, torch_api.h's
// `tensor`); the caller holds gradient mode off. Returns 0, or 1 with the
// exception's message in `err`.
#include <ATen/ops/_fused_adamw.h>
#include <ATen/core/Tensor.h>

#include <cstring>
#include <exception>
#include <optional>
#include <vector>

extern "C" int r2vpo_fused_adamw(at::Tensor **params, at::Tensor **grads, at::Tensor **exp_avgs,
                                 at::Tensor **exp_avg_sqs, at::Tensor *step, int n, double lr, double beta1,
                                 double beta2, double weight_decay, double eps, at::Tensor *grad_scale, char *err,
                                 int err_len) {
    try {
        std::vector<at::Tensor> p, g, m, v, s;
        for (int i = 0; i < n; ++i) {
            p.push_back(*params[i]);
            g.push_back(*grads[i]);
            m.push_back(*exp_avgs[i]);
            v.push_back(*exp_avg_sqs[i]);
            s.push_back(*step);
        }
        std::optional<at::Tensor> scale;
        if (grad_scale) scale = *grad_scale;
        at::_fused_adamw_(p, g, m, v, {}, s, lr, beta1, beta2, weight_decay, eps, false, false, scale, std::nullopt);
        return 0;
    } catch (const std::exception &e) {
        std::strncpy(err, e.what(), err_len - 1);
        err[err_len - 1] = 0;
        return 1;
    }
}
