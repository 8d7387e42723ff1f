"""Advantages and losses: small pure functions over tensors, no framework imports."""
