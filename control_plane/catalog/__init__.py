"""What can run where: the pool catalog (pools, accelerators, backend kinds and their settings)
and the step spec, what a piece of GPU work needs."""
