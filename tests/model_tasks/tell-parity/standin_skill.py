"""The stand-in's knowledge of tell-parity: the right answer and a plausible wrong one."""


def answer(payload: dict) -> dict:
    return {"parity": "even" if int(payload["n"]) % 2 == 0 else "odd"}


def wrong(payload: dict) -> dict:
    return {"parity": "odd" if int(payload["n"]) % 2 == 0 else "even"}
