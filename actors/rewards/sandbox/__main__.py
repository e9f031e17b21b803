"""`python -m actors.rewards.sandbox`: print which protections this machine grants sandboxed programs."""

from actors.rewards.sandbox.probe import describe_protections

print(describe_protections())
