"""A tenant's key as the AWS Encryption SDK sees it: a master key, asked once per data key.

- A local key file (`keys.LocalKeyring`) is a **raw AES keyring**: key namespace `sinewgrid-local`,
  key name the key id (`local:<tenant>:<fingerprint>`), AES-256-GCM wrapping. Any ESDK (Python,
  Java, C, JavaScript, .NET, the CLI's raw-key plug-ins) opens the data given the same three values.
- A KMS key (`keys.KmsKeyring`) is the SDK's own `KMSMasterKey`: `GenerateDataKey` / `Decrypt` with
  the message's encryption context ({"tenant": ...}), under the tenant's credentials.

`OneDataKey` is the materials manager a `Sealer` and an `Opener` hold: it asks the tenant's key
for one data key for all the messages it seals (each message still derives its own key from it,
by HKDF over its message id, and commits to it), and unwraps each data key it meets once, so a
dataset of thousands of objects costs one KMS call. Every use is logged in `keys.key_uses()`.
Workload side as well: no Dagster.
"""

from __future__ import annotations

from typing import Any

from aws_encryption_sdk.exceptions import AWSEncryptionSDKClientError, DecryptKeyError
from aws_encryption_sdk.identifiers import EncryptionKeyType, WrappingAlgorithm
from aws_encryption_sdk.internal.crypto.wrapping_keys import WrappingKey
from aws_encryption_sdk.key_providers.kms import KMSMasterKey, KMSMasterKeyConfig
from aws_encryption_sdk.key_providers.raw import RawMasterKey
from aws_encryption_sdk.materials_managers import DecryptionMaterials, DecryptionMaterialsRequest, EncryptionMaterialsRequest
from aws_encryption_sdk.materials_managers.base import CryptoMaterialsManager
from aws_encryption_sdk.materials_managers.default import DefaultCryptoMaterialsManager
from aws_encryption_sdk.structures import EncryptedDataKey

from workload_runtime.keys import Keyring, KeyUnavailable, KmsKeyring, _used

LOCAL_PROVIDER = "sinewgrid-local"
KMS_PROVIDER = "aws-kms"
_RAW_KEY_INFO_TAIL = 4 + 4 + 12  # a raw AES key's provider info: key name | tag bits | IV length | IV


def key_id_of(edk: EncryptedDataKey) -> str:
    """The key id that wrapped `edk`, as the tenants catalog names it (a KMS key by its ARN)."""
    info = bytes(edk.key_provider.key_info)
    if edk.key_provider.provider_id == LOCAL_PROVIDER:
        return info[:-_RAW_KEY_INFO_TAIL].decode(errors="replace")
    return info.decode(errors="replace")


class _LocalKey(RawMasterKey):
    """A raw AES master key that reads its key file before each use: a key disabled a moment ago
    (`sinewgrid tenants key disable`) is disabled now."""

    keyring: Any = None

    def _generate_data_key(self, algorithm, encryption_context):  # type: ignore[no-untyped-def]
        self.keyring.material()
        key = super()._generate_data_key(algorithm, encryption_context)
        _used(self.keyring.tenant, self.keyring.key_id, "generate")
        return key

    def _decrypt_data_key(self, encrypted_data_key, algorithm, encryption_context):  # type: ignore[no-untyped-def]
        self.keyring.material()
        try:
            key = super()._decrypt_data_key(encrypted_data_key, algorithm, encryption_context)
        except Exception:  # cryptography's InvalidTag: another key, or another context, wrapped it
            raise KeyUnavailable(self.keyring.tenant, self.keyring.key_id, "this data key was wrapped by another key", "The data belongs to another tenant, or the key file was replaced.") from None
        _used(self.keyring.tenant, self.keyring.key_id, "unwrap")
        return key


class _KmsKey(KMSMasterKey):
    """The SDK's KMS master key, its refusals told as `KeyUnavailable` (what KMS said, and the fix)."""

    keyring: Any = None

    def _generate_data_key(self, algorithm, encryption_context=None):  # type: ignore[no-untyped-def]
        try:
            key = super()._generate_data_key(algorithm, encryption_context)
        except AWSEncryptionSDKClientError as exc:
            raise self.keyring.refused(exc.__cause__ or exc) from None
        _used(self.keyring.tenant, self.keyring.key_id, "generate")
        return key

    def _decrypt_data_key(self, encrypted_data_key, algorithm, encryption_context=None):  # type: ignore[no-untyped-def]
        try:
            key = super()._decrypt_data_key(encrypted_data_key, algorithm, encryption_context)
        except AWSEncryptionSDKClientError as exc:
            raise self.keyring.refused(exc.__cause__ or exc) from None
        _used(self.keyring.tenant, self.keyring.key_id, "unwrap")
        return key


def master_key(keyring: Keyring, wrapped_by: str = "") -> RawMasterKey | KMSMasterKey:
    """`keyring` as an ESDK master key; `wrapped_by` is the key id a message names (KMS: its ARN),
    which must be this keyring's key."""
    if isinstance(keyring, KmsKeyring):
        key_id = wrapped_by or keyring.key_id
        if wrapped_by and not keyring.names(wrapped_by):
            raise KeyUnavailable(keyring.tenant, keyring.key_id, f"the data was sealed with KMS key {wrapped_by}, not this tenant's key",
                                 f"If the tenant moved to a new key, reseal its data: `sinewgrid tenants reseal {keyring.tenant} --old-kms-key {wrapped_by}`.")  # fmt: skip
        key: Any = _KmsKey(config=KMSMasterKeyConfig(key_id=key_id, client=keyring.client()))
    else:
        material = keyring.material()
        key = _LocalKey(
            provider_id=LOCAL_PROVIDER, key_id=keyring.key_id.encode(),
            wrapping_key=WrappingKey(wrapping_algorithm=WrappingAlgorithm.AES_256_GCM_IV12_TAG16_NO_PADDING, wrapping_key=material, wrapping_key_type=EncryptionKeyType.SYMMETRIC),
        )  # fmt: skip
    key.keyring = keyring
    return key


class OneDataKey(CryptoMaterialsManager):
    """Materials from one tenant key: one data key for every message sealed with the same context,
    and each data key met on reading unwrapped once (this object's lifetime is a Sealer's or an
    Opener's: one dataset version, one checkpoint, one load)."""

    def __init__(self, keyring: Keyring, wrapped_by: str = "") -> None:
        self._keyring, self._wrapped_by = keyring, wrapped_by
        self._backing = DefaultCryptoMaterialsManager(master_key(keyring, wrapped_by))
        self._sealing: dict[tuple, Any] = {}
        self._opening: dict[tuple, Any] = {}

    def get_encryption_materials(self, request: EncryptionMaterialsRequest) -> Any:
        at = (request.algorithm, tuple(sorted(request.encryption_context.items())))
        if at not in self._sealing:
            self._sealing[at] = self._backing.get_encryption_materials(request)
        return self._sealing[at]

    def decrypt_materials(self, request: DecryptionMaterialsRequest) -> Any:
        at = (request.algorithm, tuple(sorted(request.encryption_context.items())),
              tuple((k.key_provider, bytes(k.encrypted_data_key)) for k in request.encrypted_data_keys))  # fmt: skip
        if at not in self._opening and (made := self._made(request)) is not None:
            self._opening[at] = made
        if at not in self._opening:
            try:
                self._opening[at] = self._backing.decrypt_materials(request)
            except DecryptKeyError:  # no data key of the message is this keyring's
                raise KeyUnavailable(self._keyring.tenant, self._keyring.key_id, f"the data key was wrapped by key {self._wrapped_by or 'of another tenant'}, not this one",
                                     "The data belongs to another tenant, or the key file was replaced.") from None  # fmt: skip
        return self._opening[at]

    def _made(self, request: DecryptionMaterialsRequest) -> DecryptionMaterials | None:
        """The data key this manager made for a message it sealed: a writer reads back what it has
        just written (anndata does) without asking the tenant's key (KMS) again."""
        for sealing in self._sealing.values():
            if set(request.encrypted_data_keys) & set(sealing.encrypted_data_keys):
                return DecryptionMaterials(data_key=sealing.data_encryption_key, verification_key=None)
        return None
