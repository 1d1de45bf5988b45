"""Public MoE models, for planning from a load dump alone (`--model NAME`).

Each preset is its model's published configuration (the `config.json` of its Hugging Face
repository, cited per model): hidden size, the routed experts' intermediate size, the weights'
bytes per parameter, routed experts, top-k, decoder layers and which of them are MoE layers. An
expert's weights are its three projections (gate, up, down): 3 × hidden × intermediate ×
bytes. Shared experts and dense layers are not placed, so they are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from comoe_opt.errors import ComoeError

FP8 = 1.0  # bytes per weight of an FP8 checkpoint
BF16 = 2.0
MXFP4 = 4.25 / 8  # 4-bit values and one 8-bit scale per 32 (OCP microscaling)


@dataclass(frozen=True)
class ModelPreset:
    name: str
    hidden_size: int
    expert_intermediate_size: int
    weight_bytes: float  # bytes per expert weight
    experts: int  # routed experts per MoE layer
    top_k: int
    model_layers: int  # decoder layers, dense ones included
    moe_layer_ids: tuple[int, ...]  # model layer ids of the MoE layers
    expert_groups: int = 1  # group-limited routing's groups (DeepSeek-V3: n_group)
    activation_bytes: float = BF16  # bytes per element of the tokens dispatched to experts

    @property
    def expert_gb(self) -> float:
        """One routed expert's weights, GB (1e9 bytes)."""
        return 3 * self.hidden_size * self.expert_intermediate_size * self.weight_bytes / 1e9

    @property
    def expert_gflop_per_token(self) -> float:
        """One token through one routed expert: 2 FLOPs per weight of its three projections."""
        return 2 * 3 * self.hidden_size * self.expert_intermediate_size / 1e9


def _from(first: int, layers: int, step: int = 1) -> tuple[int, ...]:
    return tuple(range(first, layers, step))


PRESETS: dict[str, ModelPreset] = {
    # huggingface.co/deepseek-ai/DeepSeek-V3 config.json (DeepSeek-R1's is the same): hidden_size 7168,
    # moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8, num_hidden_layers 61,
    # first_k_dense_replace 3, n_group 8; FP8 weights (quantization_config fp8), FP8 dispatch
    "deepseek-v3": ModelPreset("DeepSeek-V3", 7168, 2048, FP8, 256, 8, 61, _from(3, 61), 8, FP8),
    "deepseek-r1": ModelPreset("DeepSeek-R1", 7168, 2048, FP8, 256, 8, 61, _from(3, 61), 8, FP8),
    # huggingface.co/deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size 2048, moe_intermediate_size
    # 1408, n_routed_experts 64, num_experts_per_tok 6, num_hidden_layers 27, first_k_dense_replace 1;
    # torch_dtype bfloat16
    "deepseek-v2-lite": ModelPreset("DeepSeek-V2-Lite", 2048, 1408, BF16, 64, 6, 27, _from(1, 27)),
    # huggingface.co/Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, moe_intermediate_size 768,
    # num_experts 128, num_experts_per_tok 8, num_hidden_layers 48 (every layer MoE); bfloat16
    "qwen3-30b-a3b": ModelPreset("Qwen3-30B-A3B", 2048, 768, BF16, 128, 8, 48, _from(0, 48)),
    # huggingface.co/Qwen/Qwen3-235B-A22B config.json: hidden_size 4096, moe_intermediate_size 1536,
    # num_experts 128, num_experts_per_tok 8, num_hidden_layers 94 (every layer MoE); bfloat16
    "qwen3-235b-a22b": ModelPreset("Qwen3-235B-A22B", 4096, 1536, BF16, 128, 8, 94, _from(0, 94)),
    # huggingface.co/meta-llama/Llama-4-Maverick-17B-128E config.json (text_config): hidden_size 5120,
    # intermediate_size 8192 (the experts'), num_local_experts 128, num_experts_per_tok 1,
    # num_hidden_layers 48, interleave_moe_layer_step 2 (MoE layers 1, 3, ..., 47); bfloat16
    "llama-4-maverick": ModelPreset("Llama-4-Maverick", 5120, 8192, BF16, 128, 1, 48, _from(1, 48, 2)),
    # huggingface.co/openai/gpt-oss-20b config.json: hidden_size 2880, intermediate_size 2880,
    # num_local_experts 32, num_experts_per_tok 4, num_hidden_layers 24; experts in MXFP4
    "gpt-oss-20b": ModelPreset("GPT-OSS-20B", 2880, 2880, MXFP4, 32, 4, 24, _from(0, 24)),
    # huggingface.co/openai/gpt-oss-120b config.json: as 20b with num_local_experts 128,
    # num_hidden_layers 36
    "gpt-oss-120b": ModelPreset("GPT-OSS-120B", 2880, 2880, MXFP4, 128, 4, 36, _from(0, 36)),
    # huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size 4096, intermediate_size
    # 14336, num_local_experts 8, num_experts_per_tok 2, num_hidden_layers 32; bfloat16
    "mixtral-8x7b": ModelPreset("Mixtral-8x7B", 4096, 14336, BF16, 8, 2, 32, _from(0, 32)),
    # huggingface.co/moonshotai/Kimi-K2-Instruct config.json: hidden_size 7168, moe_intermediate_size
    # 2048, n_routed_experts 384, num_experts_per_tok 8, num_hidden_layers 61, first_k_dense_replace 1,
    # n_group 1; FP8 weights
    "kimi-k2": ModelPreset("Kimi-K2", 7168, 2048, FP8, 384, 8, 61, _from(1, 61), 1, FP8),
    # huggingface.co/allenai/OLMoE-1B-7B-0924 config.json: hidden_size 2048, intermediate_size 1024,
    # num_experts 64, num_experts_per_tok 8, num_hidden_layers 16 (every layer MoE); served in bf16
    "olmoe": ModelPreset("OLMoE-1B-7B", 2048, 1024, BF16, 64, 8, 16, _from(0, 16)),
}


def preset(name: str) -> ModelPreset:
    """The preset of `name` (case and `_`/`-` insensitive), or one line naming the known ones."""
    key = name.strip().lower().replace("_", "-")
    if key not in PRESETS:
        raise ComoeError(f"--model: unknown model {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[key]
