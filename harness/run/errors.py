"""The error a config that cannot run raises, before any model is built or any GPU time spent.

`harness.run.config` raises it for a bad key, value or choice while composing and validating;
`harness.run.methods` for an unknown method or a bad method option. The CLI prints its message
(which names the bad key or value and the valid choices) and exits with status 2.
"""


class ConfigError(ValueError):
    """A config that cannot run: bad key, bad value, unknown choice. The message says which."""
