"""Scenes and robot descriptions, versioned beside the episodes.

A scene (a robot description and its world: MJCF for MuJoCo, USD for Isaac Lab, with textures if
any) is a dataset version in the same registry as the episodes, ``robotics/scenes@<scene>-<hash8>``,
named by its content. Every rollout, evaluation and policy names the scene version it ran in.

- ``catalog``: the scenes, where their files come from, how versions and sweep partition keys are named.
- ``build``: make a scene's files from its source, checked against the catalog.
- ``files``: ``SceneFiles`` (a registered version as a workload gets it) and the verified local copy it loads.
- ``registration``: register a scene version and resolve one for a run (orchestrator side).

Importing this package imports nothing else: workloads in either runtime use ``catalog`` and ``files``.
"""
