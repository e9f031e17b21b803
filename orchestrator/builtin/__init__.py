"""What ships with rayward so that a fresh machine can train offline:

    tasks/      built-in datasets and environments (letters, code, boxes, the box agent, colors, cards)
    models/     the offline tiny models, built on first use into the cache (one registry by name)
"""
