"""The replay test task (same shape in every language): a completed step's body does not
run again on the next attempt. Expected: succeeds on attempt 2, output {"one": 1, "two": 2}
and the milliseconds the attempt had left,
and the run's logs hold "step one body ran" once."""

import wasq


def one() -> int:
    wasq.log.info("step one body ran")
    return 1


def two() -> int:
    wasq.log.info("step two body ran")
    return 2


@wasq.task
def main(input: object) -> dict:
    first = wasq.step("one", one)
    if wasq.context().attempt == 1:
        raise wasq.Retryable("fail once")
    second = wasq.step("two", two)
    return {"one": first, "two": second, "left": int(wasq.time_left() * 1000)}
