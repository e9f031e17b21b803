"""Built-in tasks (datasets, environments, agents), each named by `data.path` or a preset:

    letters.py    the letter task (`data.path: toy`, `toy-mixed`)
    code.py       the code task (`data.path: code`; the `code_tests` reward runs its tests)
    boxes.py      the box task: a TRL environment class (`open_box`, `submit`, `get_reward`) and its rows
    box_agent.py  the box task as an agent written only against the `openai` SDK (configs/agent.yaml)
    colors.py     the vision task: the letter task shown as a colour (`data.path: colors`)
    cards.py      the vision tool task: a tool that returns the card's picture (`data.path: cards`)
"""
