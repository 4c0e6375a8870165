"""The data registry: every curated dataset version in a DVC-tracked git repository plus a DVC
remote under the storage root.

- `names`: dataset and version names, `dataset@version` references, the registry's errors, and
  a storage root's provider and region.
- `dataset_version`: `DatasetVersion`, one registered version and how to get it back.
- `git_mirror`: the registry's git repository, its local mirror and how it reaches upstream (a
  git server, or a bundle on the object store).
- `dvc_store`: hashing and uploading a folder to the DVC remote, and downloading a version back.
- `registry`: `DataRegistry`, the facade that finds, lists, gets and registers versions.
"""
