import numpy as np

def importance(
    base: np.ndarray,
    flags: np.ndarray,
    access_count: np.ndarray,
    last_access: np.ndarray,
    timestamps: np.ndarray,
    out: np.ndarray,
    now: float,
    access_half_life: float,
    access_weight: float,
    recency_half_life: float,
    recency_weight: float,
    pin_bonus: float,
    pinned_flag: int,
    exclude_flags: int,
) -> None: ...
