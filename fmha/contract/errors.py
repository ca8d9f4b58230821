"""The two ways a call is refused (docs/contract.md): it breaks the contract, or it is valid and
the kernel does not implement it."""


class ContractError(ValueError):
    """The arguments break the attention contract."""


class NotSupportedError(ContractError):
    """The arguments are valid, but this kernel does not implement that part of the contract."""


def fail(message: str):
    """Refuse a call: `message` names the argument, what was expected and what came in."""
    raise ContractError(message)
