"""What a competent labeller answers for `label-failure`, and a plausible mistake.

Loaded by file path by the stand-in model server: standard library only, deterministic.

The rule (the same one prompt.md states, and the one eval.jsonl's expected labels come from):

1. `ended_by` is `cart_out_of_bounds`            -> `cart-hit-track-limit`
2. the pole fell within its first second
   (`seconds_survived` < 1.0)                    -> `pole-fell-at-start`
3. otherwise the pole fell after the policy had held it, towards the side it was rotating
   to in the last frame: `final_pole_angular_velocity_rad_s` > 0 -> `pole-fell-right` (+x),
   < 0 -> `pole-fell-left` (-x); exactly 0 -> the sign of `final_pole_angle_rad` (>= 0: right).
"""

FAILURE_MODES = ("cart-hit-track-limit", "pole-fell-at-start", "pole-fell-left", "pole-fell-right")
EARLY_SECONDS = 1.0  # a fall within the first second: the policy never had the pole under control


def _side(payload, key_first, key_then):
    first = float(payload.get(key_first, 0.0))
    if first != 0.0:
        return "right" if first > 0 else "left"
    return "right" if float(payload.get(key_then, 0.0)) >= 0 else "left"


def answer(payload):
    ended_by = payload.get("ended_by")
    if ended_by == "cart_out_of_bounds":
        mode = "cart-hit-track-limit"
    elif ended_by == "pole_fell":
        if float(payload["seconds_survived"]) < EARLY_SECONDS:
            mode = "pole-fell-at-start"
        else:
            mode = "pole-fell-" + _side(payload, "final_pole_angular_velocity_rad_s", "final_pole_angle_rad")
    else:
        raise ValueError(f"label-failure labels failed trials only; this one ended by {ended_by!r}")
    return {"failure_mode": mode}


def wrong(payload):
    """The mistakes a hasty labeller makes: reading the side from the (noisy) final angle, or
    from the cart's position, ignoring how early the fall came, or mirroring the side."""
    right = answer(payload)["failure_mode"]
    if right == "cart-hit-track-limit":
        # Blames the pole: the side the cart ran to.
        mode = "pole-fell-" + _side(payload, "final_cart_position_m", "final_cart_velocity_m_s")
    elif right == "pole-fell-at-start":
        # Ignores the time: labels the side it fell to.
        mode = "pole-fell-" + _side(payload, "final_pole_angular_velocity_rad_s", "final_pole_angle_rad")
    else:
        # Reads the side from the last angle; where that agrees with the rotation, mirrors it.
        by_angle = "pole-fell-" + _side(payload, "final_pole_angle_rad", "final_pole_angular_velocity_rad_s")
        mode = by_angle if by_angle != right else ("pole-fell-left" if right == "pole-fell-right" else "pole-fell-right")
    return {"failure_mode": mode}
