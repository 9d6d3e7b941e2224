"""{{name}}: a wasq task. Input {"name": "Ada"} -> output {"greeting": "Hello, Ada!"}."""

import wasq


@wasq.task
def main(input: dict) -> dict:
    # A durable step: once it completed, a retry or resume reuses its stored result.
    def greet() -> str:
        wasq.log.info("greeting %s", input["name"])
        return f"Hello, {input['name']}!"

    return {"greeting": wasq.step("greet", greet)}
