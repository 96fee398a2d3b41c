"""Validation of ids that end up inside cgroup paths (corepin.core.ids)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.core.errors import InputError
from corepin.core.ids import (
    IdError,
    split_cgroup_path,
    validate_component,
    validate_container_id,
    validate_pid,
    validate_pod_uid,
    validate_qos,
    validate_runtime,
)
from support.budget import examples

HEX64 = "3f4e" * 16
UID = "0f8c2a6e-3b1d-4c2e-9a57-1d2e3f4a5b6c"


@pytest.mark.parametrize(
    ("runtime", "value"),
    [
        pytest.param("containerd", HEX64, id="a containerd CRI id is 64 lowercase hex digits"),
        pytest.param("docker", HEX64, id="a docker id is 64 lowercase hex digits"),
        pytest.param("cri-o", HEX64, id="a CRI-O id is 64 lowercase hex digits"),
        pytest.param("crio", HEX64, id="crio is accepted as an alias of cri-o"),
        pytest.param("generic", "probe-1", id="a generic runtime accepts a ctr-style name"),
        pytest.param("generic", "a.b_c-d9", id="generic names join words with . _ and -"),
    ],
)
def test_valid_container_ids_are_returned_unchanged(runtime: str, value: str) -> None:
    assert validate_container_id(value, runtime) == value


@pytest.mark.parametrize(
    ("runtime", "value", "needle"),
    [
        pytest.param("containerd", "../../etc", "'/'", id="a path traversal is rejected"),
        pytest.param("containerd", "..", "relative", id="a bare dot-dot is rejected"),
        pytest.param("containerd", HEX64[:-1], "64", id="63 hex digits are not a container id"),
        pytest.param("containerd", HEX64.upper(), "lowercase", id="uppercase hex is rejected"),
        pytest.param("docker", HEX64[:-1] + "g", "64", id="a non-hex digit is rejected"),
        pytest.param("containerd", "a" * 63 + "\x00", "NUL", id="a NUL byte is rejected"),
        pytest.param("generic", "a..b", "'..'", id="generic names cannot contain dot-dot"),
        pytest.param("generic", "-lead", "alphanumeric", id="generic names start alphanumeric"),
        pytest.param("generic", "x" * 77, "76", id="generic names are at most 76 characters"),
        pytest.param("generic", "ünï", "ASCII", id="non-ASCII names are rejected"),
        pytest.param("generic", "", "empty", id="the empty id is rejected"),
        pytest.param("generic", "a b", "alphanumeric", id="a space is rejected"),
    ],
)
def test_invalid_container_ids_raise_an_input_error_naming_the_value(
    runtime: str, value: str, needle: str
) -> None:
    with pytest.raises(IdError) as info:
        validate_container_id(value, runtime)
    assert needle in str(info.value)
    assert repr(value) in str(info.value)
    assert isinstance(info.value, InputError) and info.value.exit_code == 2
    assert info.value.reason == "bad_id"


def test_unknown_runtime_is_rejected_with_the_list_of_known_ones() -> None:
    with pytest.raises(IdError, match="containerd"):
        validate_runtime("rkt")


def test_non_string_container_id_is_rejected() -> None:
    with pytest.raises(IdError, match="must be a string"):
        validate_container_id(42)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        pytest.param(UID, UID, id="a dashed UUID is canonical"),
        pytest.param(UID.replace("-", "_"), UID, id="the systemd underscore form maps back"),
        pytest.param(
            "6a1e4b9e0c4d4e5bbf2f0bd7a1c5e0f3",
            "6a1e4b9e0c4d4e5bbf2f0bd7a1c5e0f3",
            id="a static pod's 32 hex uid is accepted",
        ),
    ],
)
def test_pod_uids_are_normalised_to_the_dashed_form(value: str, canonical: str) -> None:
    assert validate_pod_uid(value) == canonical


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(UID.upper(), id="an uppercase UUID is rejected"),
        pytest.param(UID + "/..", id="a uid followed by a traversal is rejected"),
        pytest.param(UID[:-1], id="a truncated UUID is rejected"),
        pytest.param(UID.replace("-", "_", 2), id="a mix of dashes and underscores is rejected"),
        pytest.param("pod" + UID, id="the pod prefix is not part of the uid"),
    ],
)
def test_bad_pod_uids_are_rejected(value: str) -> None:
    with pytest.raises(IdError):
        validate_pod_uid(value)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [("Guaranteed", "guaranteed"), ("burstable", "burstable"), ("BestEffort", "besteffort")],
)
def test_qos_classes_are_case_insensitive(value: str, canonical: str) -> None:
    assert validate_qos(value) == canonical


def test_unknown_qos_class_is_rejected() -> None:
    with pytest.raises(IdError, match="burstable"):
        validate_qos("premium")


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("kubepods.slice", id="a slice name is a valid component"),
        pytest.param("cri-containerd-" + HEX64 + ".scope", id="a scope name is a valid component"),
        pytest.param("corepin-test-1a2b", id="a scratch group name is a valid component"),
    ],
)
def test_valid_components(value: str) -> None:
    assert validate_component(value) == value


@pytest.mark.parametrize(
    "value",
    ["", ".", "..", "a/b", "a\x00b", "a b", "a*b", "x" * 256, "a..b", "$(reboot)"],
)
def test_unsafe_components_are_rejected(value: str) -> None:
    with pytest.raises(IdError):
        validate_component(value)


def test_split_cgroup_path_validates_every_component_and_tolerates_outer_slashes() -> None:
    assert split_cgroup_path("/kubepods/burstable/") == ("kubepods", "burstable")
    assert split_cgroup_path("") == ()
    assert split_cgroup_path("/") == ()
    for bad in ("kubepods//x", "kubepods/../etc", "kubepods/\x00", "a/b c"):
        with pytest.raises(IdError):
            split_cgroup_path(bad)


def test_pids_must_be_positive_ints() -> None:
    assert validate_pid(1) == 1
    for bad in (0, -1, True, "12", 2**23):
        with pytest.raises(IdError):
            validate_pid(bad)


@settings(max_examples=examples(200))
@given(st.text(max_size=80))
def test_no_accepted_component_can_escape_its_directory(text: str) -> None:
    try:
        value = validate_component(text)
    except IdError:
        return
    assert "/" not in value and "\x00" not in value
    assert value not in (".", "..") and ".." not in value
    assert value.isascii() and 0 < len(value) <= 255


@settings(max_examples=examples(200))
@given(st.text(alphabet="0123456789abcdef-_/.xX", max_size=70))
def test_any_accepted_container_id_is_64_hex(text: str) -> None:
    try:
        value = validate_container_id(text, "containerd")
    except IdError:
        return
    assert len(value) == 64 and set(value) <= set("0123456789abcdef")
