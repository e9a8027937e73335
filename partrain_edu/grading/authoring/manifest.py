"""Which checks grade each exercise, and with which of the learner's functions (by name) — generated
from the check(...) calls in solutions/ by `python -m partrain_edu.grading.authoring.make_exercises`; never edit.

`partrain-edu check` takes the checks that count from here, the instructor's copy, never from a
submission (headless/grader.py)."""

EXERCISES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    '01_ring_all_reduce': (
        ('ring_all_reduce', ('ring_all_reduce',)),
    ),
    '02_ddp_buckets': (
        ('ddp_buckets', ('register_bucket_hooks',)),
    ),
    '03_memory_zero_stage': (
        ('model_state_bytes', ('model_state_bytes',)),
        ('zero_stage', ('smallest_zero_stage',)),
    ),
    '04_zero1_optimizer': (
        ('zero1_step', ('zero1_step',)),
    ),
    '05_tensor_parallel': (
        ('tp_f_g', ('f_forward', 'f_backward', 'g_forward', 'g_backward')),
        ('tp_mlp', ('parallel_mlp',)),
    ),
    '06_pipeline_1f1b': (
        ('one_f_one_b', ('one_f_one_b',)),
    ),
    '07_3d_parallel': (
        ('groups_inside_node', ('groups_inside_node',)),
        ('build_groups', ('build_groups',)),
    ),
    '08_zero3_unit': (
        ('zero3_unit', ('fsdp_step',)),
    ),
    '09_sharded_optimizer': (
        ('sharded_optimizer', ('make_sharded_optimizer',)),
    ),
    '10_activation_checkpointing': (
        ('activation_checkpointing', ('forward_under_budget',)),
    ),
    '11_pipeline_executor': (
        ('pipeline_executor', ('one_f_one_b_step',)),
    ),
    '12_ring_attention': (
        ('ring_attention', ('ring_attention',)),
    ),
    '13_communication_bounds': (
        ('max_dp_degree', ('max_dp_degree',)),
        ('max_fsdp_degree', ('max_fsdp_degree',)),
        ('max_tp_degree', ('max_tp_degree',)),
        ('min_dp_batch', ('min_dp_batch',)),
    ),
}
