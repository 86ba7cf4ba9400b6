"""Who a caller is: NATS decentralized (JWT) authentication for users, agents and controllers.

``jwt`` encodes and signs the tokens, ``roles`` says what each role may publish and subscribe,
``issuer`` keeps the signing keys and the user registry on disk, ``push`` hands a changed account
(a revocation) to running servers. See docs/security.md for why JWTs and not a static user list.
"""
