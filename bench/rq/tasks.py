"""The job RQ's side of wasq's side-by-side benchmark runs: a no-op that returns its input."""


def echo(data):
    return data
