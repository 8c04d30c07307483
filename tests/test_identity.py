"""Identity tokens (workflows.identity), without a server: which tokens prove who answered, and
what the sender is told when one does not. Every refusal is an IdentityError with a one-line
reason that never quotes the token or its claims."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given, settings
from hypothesis import strategies as st
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows import identity as identity_module
from temporal_agent_interrupts.workflows.identity import (
    ANSWER_CLAIM,
    MAX_BOUND_CALLS,
    MAX_TOKEN_BYTES,
    AnswerBinding,
    IdentityError,
    VerifiedIdentity,
    check_trust,
    verify_token,
)
from temporal_agent_interrupts.workflows.types import TrustSpec

NOW = datetime(2030, 1, 1, tzinfo=UTC)
MALFORMED = "the identity token is malformed: it is not a JWT (header.claims.signature)"

# Keys are made once per module: an RSA key pair takes a noticeable moment.
ISSUERS: dict[str, TokenIssuer] = {}


def issuer(alg: str = "RS256", kid: str = "k1") -> TokenIssuer:
    name = f"{alg}/{kid}"
    if name not in ISSUERS:
        ISSUERS[name] = TokenIssuer(alg, kid=kid)  # type: ignore[arg-type]  # alg from a parameter
    return ISSUERS[name]


def refusal(token: Any, trust: TrustSpec, *, now: datetime = NOW) -> str:
    """The reason ``token`` is refused, checked to be one line that does not quote it."""
    with pytest.raises(IdentityError) as caught:
        verify_token(token, trust, now=now)
    reason = caught.value.reason
    assert "\n" not in reason and reason == str(caught.value)
    if isinstance(token, str) and token:
        assert token not in reason
        for part in token.split("."):
            assert len(part) < 8 or part not in reason
    return reason


def sign_raw(payload: bytes, *, key: Any, alg: str, headers: dict[str, Any]) -> str:
    """A token whose claims are exactly ``payload`` (bytes PyJWT's encoder would not write)."""
    return jwt.PyJWS().encode(payload, key, algorithm=alg, headers=headers)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims_of(token: str) -> dict[str, Any]:
    return jwt.decode(token, options={"verify_signature": False})


# ---------------------------------------------------------------------------------------------
# Accepted tokens.


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
def test_a_token_from_the_trusted_issuer_proves_who_answered(alg: str) -> None:
    idp = issuer(alg)
    token = idp.mint("alice@corp.test", groups=["finance", "ops"], issued_at=NOW)
    verified = verify_token(token, idp.trust_spec(), now=NOW + timedelta(minutes=1))
    assert verified == VerifiedIdentity(
        identity="alice@corp.test",
        groups=("finance", "ops"),
        # Spent until it can no longer be accepted: its expiry plus the minute of leeway.
        expires=NOW + timedelta(minutes=11),
        # What it signs (header and claims), not how its signature is spelled.
        digest=hashlib.sha256(token.rsplit(".", 1)[0].encode()).hexdigest()[:32],
        subject=jwt.decode(token, options={"verify_signature": False})["sub"],
        issued=NOW,
        # The trusted key that verified it, for the decision's receipt.
        key_id="k1",
    )
    assert verified.expires.tzinfo is UTC
    assert jwt.get_unverified_header(token)["alg"] == alg


def test_the_digest_tells_tokens_apart_and_recognises_one_used_again() -> None:
    idp = issuer()
    first = idp.mint("alice@corp.test", issued_at=NOW)
    second = idp.mint("alice@corp.test", issued_at=NOW + timedelta(seconds=1))
    trust = idp.trust_spec()
    a, b = verify_token(first, trust, now=NOW), verify_token(second, trust, now=NOW)
    assert a.identity == b.identity and a.digest != b.digest
    assert verify_token(first, trust, now=NOW + timedelta(minutes=5)).digest == a.digest
    assert len(a.digest) == 32 and int(a.digest, 16) >= 0


def test_a_naive_now_is_taken_as_utc() -> None:
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW, expires_in=timedelta(minutes=1))
    naive = datetime(2030, 1, 1, 0, 0, 30)
    assert verify_token(token, idp.trust_spec(), now=naive).identity == "alice@corp.test"
    assert "expired" in refusal(token, idp.trust_spec(), now=naive + timedelta(minutes=2))


def test_a_list_audience_that_includes_the_agents_is_accepted() -> None:
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW, audience=["other-app", "agents"])
    assert verify_token(token, idp.trust_spec(), now=NOW).identity == "alice@corp.test"


# ---------------------------------------------------------------------------------------------
# Time: exp and nbf against the workflow's clock, with leeway.


def test_an_expired_token_is_refused_saying_when_it_expired() -> None:
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW - timedelta(hours=1))
    assert refusal(token, idp.trust_spec()) == (
        "the identity token expired at 2029-12-31T23:10:00+00:00"
    )


def test_a_token_expired_within_the_leeway_is_accepted() -> None:
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW, expires_in=timedelta(minutes=10))
    expiry = NOW + timedelta(minutes=10)
    trust = idp.trust_spec(leeway_seconds=60)
    assert verify_token(token, trust, now=expiry + timedelta(seconds=59)).identity
    # At exactly exp + leeway it has expired (PyJWT's rule: exp <= now - leeway).
    assert refusal(token, trust, now=expiry + timedelta(seconds=60)) == (
        "the identity token expired at 2030-01-01T00:10:00+00:00"
    )
    strict = idp.trust_spec(leeway_seconds=0)
    assert verify_token(token, strict, now=expiry - timedelta(seconds=1)).identity
    assert "expired at" in refusal(token, strict, now=expiry)


def test_a_token_not_valid_yet_is_refused_unless_within_the_leeway() -> None:
    idp = issuer()
    soon = idp.mint("alice@corp.test", issued_at=NOW, not_before=NOW + timedelta(minutes=5))
    assert refusal(soon, idp.trust_spec()) == (
        "the identity token is not valid yet: not before 2030-01-01T00:05:00+00:00"
    )
    assert verify_token(soon, idp.trust_spec(), now=NOW + timedelta(minutes=4, seconds=30))
    skewed = idp.mint("alice@corp.test", issued_at=NOW, not_before=NOW + timedelta(seconds=30))
    assert verify_token(skewed, idp.trust_spec(), now=NOW).identity == "alice@corp.test"


def test_iat_in_the_future_is_not_a_reason_to_refuse() -> None:
    """Only exp and nbf bound a token's validity; PyJWT's iat check (real clock) is off."""
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW + timedelta(hours=1))
    assert verify_token(token, idp.trust_spec(), now=NOW).identity == "alice@corp.test"


def test_pyjwt_never_judges_time_by_the_real_clock() -> None:
    """A token valid at the workflow's time is accepted though it expired long ago in real time
    (and one not valid yet at the workflow's time is refused though it is valid now)."""
    idp = issuer()
    long_ago = datetime(2001, 1, 1, tzinfo=UTC)
    old = idp.mint("alice@corp.test", issued_at=long_ago)
    assert verify_token(old, idp.trust_spec(), now=long_ago).identity == "alice@corp.test"
    current = idp.mint("alice@corp.test", not_before=datetime.now(UTC))
    assert "not valid yet" in refusal(current, idp.trust_spec(), now=long_ago)


# ---------------------------------------------------------------------------------------------
# Who signed it, and for whom.


def test_a_forged_signature_with_the_trusted_kid_is_refused() -> None:
    trusted, forger = issuer("ES256", kid="k1"), TokenIssuer("ES256", kid="k1")
    token = forger.mint("alice@corp.test", issued_at=NOW)
    assert refusal(token, trusted.trust_spec()) == (
        "the identity token's signature does not verify with this agent's key 'k1': it was "
        "altered, or signed by a key this agent does not trust"
    )


def test_a_token_from_a_key_not_in_the_jwks_is_refused_naming_its_kid() -> None:
    trusted, other = issuer("RS256", kid="k1"), issuer("RS256", kid="rogue-7")
    token = other.mint("alice@corp.test", issued_at=NOW)
    assert refusal(token, trusted.trust_spec()) == (
        "the identity token is signed by a key this agent does not trust (kid 'rogue-7')"
    )


def test_a_hostile_kid_is_not_echoed_verbatim() -> None:
    idp = issuer()
    key = idp.private_key
    long_kid = sign_raw(b"{}", key=key, alg="RS256", headers={"kid": "x" * 5000})
    assert refusal(long_kid, idp.trust_spec()).endswith(f"(kid '{'x' * 64}...')")
    escapes = sign_raw(b"{}", key=key, alg="RS256", headers={"kid": "a\x1b[31mb\nc"})
    assert refusal(escapes, idp.trust_spec()).endswith("(kid (unprintable))")


def test_a_tampered_payload_is_refused() -> None:
    idp = issuer("EdDSA")
    token = idp.mint("mallory@corp.test", issued_at=NOW)
    header, _, signature = token.split(".")
    claims = claims_of(token) | {"email": "ceo@corp.test", "groups": ["admins"]}
    forged = f"{header}.{b64(json.dumps(claims).encode())}.{signature}"
    reason = refusal(forged, idp.trust_spec())
    assert reason.startswith("the identity token's signature does not verify")
    assert "ceo@corp.test" not in reason and "admins" not in reason


def test_a_token_from_another_issuer_is_refused() -> None:
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW, issuer="https://evil.test")
    assert refusal(token, idp.trust_spec()) == (
        "the identity token is not from the issuer this agent trusts ('https://idp.test')"
    )


def test_a_token_for_another_audience_is_refused() -> None:
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW, audience="payroll-app")
    reason = refusal(token, idp.trust_spec())
    assert reason == "the identity token is not for this agent's audience ('agents')"
    assert "payroll-app" not in reason


@pytest.mark.parametrize("claim", ["exp", "iss", "aud"])
def test_a_token_without_a_required_claim_is_refused_naming_it(claim: str) -> None:
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW, extra={claim: None})
    assert refusal(token, idp.trust_spec()) == f"the identity token has no '{claim}' claim"


# ---------------------------------------------------------------------------------------------
# Algorithms: never none, never HS*, and only what the chosen key verifies.


def test_an_unsigned_token_alg_none_is_refused() -> None:
    idp = issuer()
    claims = claims_of(idp.mint("alice@corp.test", issued_at=NOW))
    token = jwt.encode(claims, "", algorithm="none", headers={"kid": "k1"})
    assert token.endswith(".")  # no signature at all
    assert refusal(token, idp.trust_spec()) == (
        "the identity token is signed with algorithm 'none', which is not accepted (accepted: "
        "EdDSA, ES256, ES384, PS256, RS256, RS384, RS512)"
    )


def test_an_hmac_token_is_refused_whatever_the_secret() -> None:
    idp = issuer()
    claims = claims_of(idp.mint("alice@corp.test", issued_at=NOW))
    for alg in ("HS256", "HS512"):
        token = jwt.encode(claims, "s" * 64, algorithm=alg, headers={"kid": "k1"})
        assert refusal(token, idp.trust_spec()).startswith(
            f"the identity token is signed with algorithm '{alg}', which is not accepted"
        )
    # The classic confusion: HMAC keyed with the issuer's public key, which anyone can read
    # (PyJWT will not sign that way, so it is done by hand).
    public_pem = idp.private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = b64(b'{"alg":"HS256","kid":"k1"}')
    signing_input = f"{header}.{b64(json.dumps(claims).encode())}"
    mac = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    confused = f"{signing_input}.{b64(mac)}"
    assert "'HS256', which is not accepted" in refusal(confused, idp.trust_spec())


def test_the_algorithm_must_be_the_one_the_key_is_for() -> None:
    rsa_idp = issuer("RS256")
    claims = claims_of(rsa_idp.mint("alice@corp.test", issued_at=NOW))
    # The same RSA key, but RS384 where the JWK says alg RS256.
    rs384 = jwt.encode(claims, rsa_idp.private_key, algorithm="RS384", headers={"kid": "k1"})
    assert refusal(rs384, rsa_idp.trust_spec()) == (
        "the identity token is signed with algorithm 'RS384', but this agent's key 'k1' (RSA) "
        "verifies only RS256"
    )
    # Without an alg in the JWK, an RSA key verifies any accepted RSA algorithm.
    loose = rsa_idp.jwk()
    del loose["alg"]
    trust = rsa_idp.trust_spec().model_copy(update={"jwks": {"keys": [loose]}})
    assert verify_token(rs384, trust, now=NOW).identity == "alice@corp.test"
    for alg in ("RS512", "PS256"):
        token = jwt.encode(claims, rsa_idp.private_key, algorithm=alg, headers={"kid": "k1"})
        assert verify_token(token, trust, now=NOW).identity == "alice@corp.test"
    # An EC algorithm named against the RSA key.
    ec_idp = issuer("ES256", kid="k1")
    es256 = ec_idp.mint("alice@corp.test", issued_at=NOW)
    assert refusal(es256, trust) == (
        "the identity token is signed with algorithm 'ES256', but this agent's key 'k1' (RSA) "
        "verifies only PS256, RS256, RS384, RS512"
    )


def test_a_header_without_kid_needs_a_single_trusted_key() -> None:
    one, two = issuer("ES256", kid="a"), issuer("EdDSA", kid="b")
    claims = claims_of(one.mint("alice@corp.test", issued_at=NOW))
    token = jwt.encode(claims, one.private_key, algorithm="ES256")
    assert "kid" not in jwt.get_unverified_header(token)
    assert verify_token(token, one.trust_spec(), now=NOW).identity == "alice@corp.test"
    both = one.trust_spec().model_copy(update={"jwks": {"keys": [one.jwk(), two.jwk()]}})
    assert refusal(token, both) == (
        "the identity token names no key (no 'kid' in its header), and this agent trusts 2: "
        "the issuer must name the key it signed with"
    )
    # With a kid, either key of the set verifies its own tokens.
    assert verify_token(two.mint("bob@corp.test", issued_at=NOW), both, now=NOW).identity == (
        "bob@corp.test"
    )


# ---------------------------------------------------------------------------------------------
# Malformed and oversized input: always an IdentityError, never another exception.


def test_an_oversized_token_is_refused_before_it_is_parsed() -> None:
    idp = issuer()
    padded = idp.mint("alice@corp.test", issued_at=NOW, extra={"pad": "p" * MAX_TOKEN_BYTES})
    assert refusal(padded, idp.trust_spec()).startswith("the identity token is 11.")
    assert refusal("x" * 9000, idp.trust_spec()) == (
        "the identity token is 8.8 KiB; the limit is 8.0 KiB"
    )
    just_fits = idp.mint("alice@corp.test", issued_at=NOW, extra={"pad": ""})
    room = MAX_TOKEN_BYTES - len(just_fits)
    at_limit = idp.mint("alice@corp.test", issued_at=NOW, extra={"pad": "p" * (room * 3 // 4)})
    assert len(at_limit) <= MAX_TOKEN_BYTES
    assert verify_token(at_limit, idp.trust_spec(), now=NOW).identity == "alice@corp.test"


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "not a jwt",
        "a.b.c",
        "...",
        "eyJhbGciOiJSUzI1NiJ9",
        "é.é.é",
        "\ud83d",
        b64(b"[1,2]") + ".e30.c2ln",
        b64(b'{"alg":"RS256","crit":["exp"]}') + ".e30.c2ln",
    ],
)
def test_garbage_is_refused_as_malformed(garbage: str) -> None:
    assert refusal(garbage, issuer().trust_spec()) == MALFORMED


def test_a_token_that_is_not_text_is_refused() -> None:
    assert refusal(None, issuer().trust_spec()) == "the identity token must be text (a JWT)"
    assert refusal(b"a.b.c", issuer().trust_spec()) == "the identity token must be text (a JWT)"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"[1, 2]", MALFORMED),
        (b"not json", MALFORMED),
        (
            b'{"iss":"https://idp.test","aud":"agents","exp":"tomorrow","sub":"a"}',
            "the identity token is malformed: its 'exp' is not a number",
        ),
        (
            b'{"iss":"https://idp.test","aud":"agents","exp":true,"sub":"a"}',
            "the identity token is malformed: its 'exp' is not a number",
        ),
        (
            b'{"iss":"https://idp.test","aud":"agents","exp":NaN,"sub":"a"}',
            "the identity token is malformed: its 'exp' is not finite",
        ),
        (
            b'{"iss":"https://idp.test","aud":"agents","exp":1e300,"sub":"a"}',
            "the identity token is malformed: its 'exp' is out of range",
        ),
        (
            b'{"iss":"https://idp.test","aud":"agents","exp":1893456600,"nbf":[1],"sub":"a"}',
            "the identity token is malformed: its 'nbf' is not a number",
        ),
        (
            b'{"iss":"https://idp.test","aud":"agents","exp":1893456600,"sub":42}',
            "the identity token is malformed: its 'sub' is not text",
        ),
        (
            b'{"iss":["https://idp.test"],"aud":"agents","exp":1893456600,"sub":"a"}',
            "the identity token is not from the issuer this agent trusts ('https://idp.test')",
        ),
        (
            b'{"iss":"https://idp.test","aud":{"x":1},"exp":1893456600,"sub":"a"}',
            "the identity token is not for this agent's audience ('agents')",
        ),
    ],
)
def test_signed_but_malformed_claims_are_refused(payload: bytes, reason: str) -> None:
    idp = issuer("ES256")
    token = sign_raw(payload, key=idp.private_key, alg="ES256", headers={"kid": "k1"})
    assert refusal(token, idp.trust_spec()) == reason


def test_no_exception_but_identity_error_escapes_even_with_unchecked_keys() -> None:
    """A trust that skipped check_trust (a bug elsewhere) still only refuses."""
    idp = issuer()
    token = idp.mint("alice@corp.test", issued_at=NOW)
    for jwks in ({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}, {"keys": "none"}, {}, {1: 2}):
        trust = idp.trust_spec().model_copy(update={"jwks": jwks})
        assert refusal(token, trust).startswith("this agent's trusted keys are not usable: ")


# ---------------------------------------------------------------------------------------------
# Who the token names, and their groups.


def test_email_is_the_identity_and_sub_stands_in_without_one() -> None:
    idp = issuer()
    trust = idp.trust_spec()
    with_email = idp.mint("alice@corp.test", issued_at=NOW)
    assert claims_of(with_email)["sub"] != "alice@corp.test"
    assert verify_token(with_email, trust, now=NOW).identity == "alice@corp.test"
    sub_only = idp.mint("user-42", claim="sub", issued_at=NOW)
    assert verify_token(sub_only, trust, now=NOW).identity == "user-42"
    empty_email = idp.mint("user-42", claim="sub", issued_at=NOW, extra={"email": ""})
    assert verify_token(empty_email, trust, now=NOW).identity == "user-42"
    odd_email = idp.mint("user-42", claim="sub", issued_at=NOW, extra={"email": ["a@b"]})
    assert verify_token(odd_email, trust, now=NOW).identity == "user-42"


def test_an_email_the_issuer_says_is_unverified_does_not_name_the_holder() -> None:
    idp = issuer()
    token = idp.mint(
        "ceo@corp.test", issued_at=NOW, extra={"sub": "acct-9", "email_verified": False}
    )
    assert verify_token(token, idp.trust_spec(), now=NOW).identity == "acct-9"
    verified = idp.mint("ceo@corp.test", issued_at=NOW, extra={"email_verified": True})
    assert verify_token(verified, idp.trust_spec(), now=NOW).identity == "ceo@corp.test"
    # An issuer that does not say: the address proves nothing either.
    silent = idp.mint(
        "ceo@corp.test", issued_at=NOW, extra={"sub": "acct-9", "email_verified": None}
    )
    assert verify_token(silent, idp.trust_spec(), now=NOW).identity == "acct-9"
    odd = idp.mint(
        "ceo@corp.test", issued_at=NOW, extra={"sub": "acct-9", "email_verified": "true"}
    )
    assert verify_token(odd, idp.trust_spec(), now=NOW).identity == "acct-9"
    # Another claim, when the agent says its issuer vouches for that one.
    upn = idp.mint("ceo@corp.test", issued_at=NOW, claim="upn", extra={"sub": "acct-9"})
    vouched = idp.trust_spec().model_copy(update={"identity_claim": "upn"})
    assert verify_token(upn, vouched, now=NOW).identity == "ceo@corp.test"


def test_a_token_naming_nobody_is_refused() -> None:
    idp = issuer()
    nobody = idp.mint("x", claim="name", issued_at=NOW)
    assert refusal(nobody, idp.trust_spec()) == (
        "the identity token names nobody: it has no 'email' (verified) and no 'sub' claim"
    )
    empty_sub = idp.mint("", claim="sub", issued_at=NOW)
    assert "names nobody" in refusal(empty_sub, idp.trust_spec())


def test_an_identity_that_is_not_one_line_or_too_long_is_refused() -> None:
    idp = issuer()
    broken = idp.mint("alice@corp.test\nadmin", issued_at=NOW)
    assert refusal(broken, idp.trust_spec()) == (
        "the identity the token names holds control characters (line breaks, escapes); use one line"
    )
    long = idp.mint("a" * 300 + "@corp.test", issued_at=NOW)
    assert refusal(long, idp.trust_spec()).startswith("the identity the token names is 310 bytes")


def test_groups_are_read_from_the_groups_claim() -> None:
    idp = issuer()
    trust = idp.trust_spec()

    def groups(value: Any, spec: TrustSpec = trust) -> tuple[str, ...]:
        token = idp.mint("alice@corp.test", issued_at=NOW, extra={"groups": value})
        return verify_token(token, spec, now=NOW).groups

    assert groups(["ops", "finance"]) == ("ops", "finance")
    # Non-text items, empty names, names with control characters and repeats are dropped.
    assert groups(["ops", 7, None, "", "a\nb", {"x": 1}, "ops", "finance"]) == ("ops", "finance")
    # A claim that is not a list lists no groups.
    assert groups("ops") == ()
    assert groups({"ops": True}) == ()
    assert groups(None) == ()
    # Another claim, when the agent says so.
    roles = idp.trust_spec(groups_claim="roles")
    token = idp.mint(
        "alice@corp.test", groups=["ignored"], issued_at=NOW, extra={"roles": ["approvers"]}
    )
    assert verify_token(token, roles, now=NOW).groups == ("approvers",)


# ---------------------------------------------------------------------------------------------
# What refusals may say.


def test_no_reason_quotes_the_token_or_a_claim() -> None:
    idp = issuer()
    secret = "s3cr3t-claim-value"
    trust = idp.trust_spec()
    bad = [
        idp.mint(secret, issued_at=NOW - timedelta(days=1), extra={"pwd": secret}),
        idp.mint(secret, issued_at=NOW, issuer=secret),
        idp.mint(secret, issued_at=NOW, audience=secret),
        idp.mint(secret, issued_at=NOW, not_before=NOW + timedelta(days=1)),
        idp.mint(secret, claim="name", issued_at=NOW),
        TokenIssuer("RS256", kid="k1").mint(secret, issued_at=NOW),
        idp.mint(secret + "\n", issued_at=NOW),
        idp.mint(secret, issued_at=NOW, extra={"exp": secret}),
    ]
    reasons = {refusal(token, trust) for token in bad}
    assert len(reasons) == len(bad)
    assert not any(secret in reason for reason in reasons)


# ---------------------------------------------------------------------------------------------
# check_trust: what an agent may declare.


def test_test_issuers_make_acceptable_trust() -> None:
    for alg in ("RS256", "ES256", "EdDSA"):
        idp = issuer(alg)
        check_trust(idp.trust_spec())
        (jwk,) = idp.jwks()["keys"]
        assert jwk["kid"] == "k1" and jwk["alg"] == alg and jwk["use"] == "sig"
        assert "d" not in jwk
    assert len(TokenIssuer("EdDSA").kid) == 16


def spec(*keys: dict[str, Any], **fields: Any) -> TrustSpec:
    return TrustSpec(
        issuer=fields.pop("issuer", "https://idp.test"),
        audience=fields.pop("audience", "agents"),
        jwks={"keys": list(keys)},
        **fields,
    )


def test_check_trust_refuses_private_keys() -> None:
    key = issuer().private_key
    assert isinstance(key, rsa.RSAPrivateKey)
    private = RSAAlgorithm.to_jwk(key, as_dict=True) | {"kid": "k1"}
    with pytest.raises(ValueError, match=r"^trusted key 'k1' holds private key material"):
        check_trust(spec(private))
    ec_private = ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP256R1()), as_dict=True)
    with pytest.raises(ValueError, match=r"^trusted key 1 holds private key material \('d'\)"):
        check_trust(spec(ec_private))


def test_check_trust_refuses_symmetric_keys() -> None:
    with pytest.raises(ValueError, match=r"^trusted key 'h' is a symmetric key \(kty 'oct'\)"):
        check_trust(spec({"kty": "oct", "k": "c2VjcmV0", "kid": "h", "alg": "HS256"}))


def test_check_trust_refuses_an_empty_or_shapeless_set() -> None:
    with pytest.raises(ValueError, match="JWK Set has no keys"):
        check_trust(spec())
    for jwks in ({}, {"keys": {}}, {"keys": "k"}):
        with pytest.raises(ValueError, match=r'must be a JWK Set: \{"keys": \[\.\.\.\]\}'):
            check_trust(spec().model_copy(update={"jwks": jwks}))
    with pytest.raises(ValueError, match="key 1 of a trusted issuer's JWK Set is not a JSON"):
        check_trust(spec("kty"))  # type: ignore[arg-type]  # a string where a JWK belongs


def test_check_trust_needs_a_kid_on_each_of_several_keys() -> None:
    a, b = issuer("ES256", kid="a").jwk(), issuer("EdDSA", kid="b").jwk()
    check_trust(spec(a, b))
    del b["kid"]
    with pytest.raises(ValueError, match=r"has 2 keys, so each needs a 'kid' .*\(key 2 has none"):
        check_trust(spec(a, b))
    check_trust(spec(b))  # alone, a key needs no kid
    with pytest.raises(ValueError, match="two keys with kid 'a'"):
        check_trust(spec(a, dict(a)))


def test_check_trust_refuses_unusable_keys() -> None:
    good = issuer("RS256").jwk()
    weak = RSAAlgorithm.to_jwk(
        rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key(), as_dict=True
    )
    p521 = ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP521R1()).public_key(), as_dict=True)
    cases: list[tuple[dict[str, Any], str]] = [
        (weak, r"^trusted key 1 is a 1024-bit RSA key; at least 2048 bits are required$"),
        (p521, r"not an accepted type \(kty 'EC', crv 'P-521'\); accepted: RSA, EC"),
        ({"kty": "OKP", "crv": "X25519", "x": "AAAA"}, r"kty 'OKP', crv 'X25519'"),
        ({"kty": "PGP"}, r"not an accepted type \(kty 'PGP'\)"),
        ({}, r"not an accepted type \(kty \(none\)\)"),
        (good | {"alg": "HS256"}, r"names algorithm 'HS256', which an RSA key may not use"),
        (good | {"alg": "ES256"}, r"names algorithm 'ES256'"),
        (good | {"alg": ["RS256"]}, r"names algorithm \(a list, not text\)"),
        (good | {"use": "enc"}, r"is for use 'enc'; only signing keys \('sig'\) verify"),
        (good | {"n": "AAAA"}, r"^trusted key 'k1' is not a valid RSA public key$"),
        (good | {"kid": 5}, r"has a kid that is not text"),
    ]
    for jwk, reason in cases:
        with pytest.raises(ValueError, match=reason):
            check_trust(spec(jwk))


def test_check_trust_refuses_a_missing_issuer_audience_or_odd_settings() -> None:
    key = issuer().jwk()
    with pytest.raises(ValueError, match=r"needs its issuer \(the tokens' 'iss'\)"):
        check_trust(spec(key, issuer=" "))
    with pytest.raises(ValueError, match=r"needs its audience \(the tokens' 'aud'\)"):
        check_trust(spec(key, audience=""))
    with pytest.raises(ValueError, match="groups_claim must name a claim"):
        check_trust(spec(key, groups_claim=""))
    for leeway in (-1.0, float("nan"), 7200.0):
        with pytest.raises(ValueError, match="leeway must be between 0 and 3600 seconds"):
            check_trust(spec(key, leeway_seconds=leeway))


# ---------------------------------------------------------------------------------------------
# The key cache.


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records each time a JWK Set is parsed (rather than found in the cache)."""
    seen: list[object] = []
    real = identity_module._parse_key_set

    def counting(jwks: Any) -> Any:
        seen.append(jwks)
        return real(jwks)

    monkeypatch.setattr(identity_module, "_parse_key_set", counting)
    monkeypatch.setattr(identity_module, "_KEY_SETS", {})
    return seen


def test_a_key_set_is_parsed_once_then_cached_by_content(parses: list[object]) -> None:
    idp = issuer("ES256")
    trust = idp.trust_spec()
    for _ in range(3):
        verify_token(idp.mint("alice@corp.test", issued_at=NOW), trust, now=NOW)
    # An equal set (another object, keys in another order) is the same entry.
    reordered = {"keys": [dict(reversed(list(idp.jwk().items())))]}
    same = trust.model_copy(update={"jwks": reordered})
    verify_token(idp.mint("alice@corp.test", issued_at=NOW), same, now=NOW)
    assert len(parses) == 1
    verify_token(issuer("EdDSA").mint("a@b", issued_at=NOW), issuer("EdDSA").trust_spec(), now=NOW)
    assert len(parses) == 2


def test_the_cache_stays_bounded(parses: list[object]) -> None:
    idp = issuer("ES256")
    for n in range(identity_module.KEY_SET_CACHE + 5):
        check_trust(idp.trust_spec().model_copy(update={"jwks": {"keys": [idp.jwk()], "n": n}}))
    assert len(parses) == identity_module.KEY_SET_CACHE + 5
    assert len(identity_module._KEY_SETS) <= identity_module.KEY_SET_CACHE


# ---------------------------------------------------------------------------------------------
# A token bound to one answer (the web app's login exchange).


def test_a_token_bound_to_an_answer_says_which_and_a_token_that_is_not_answers_any() -> None:
    signer = issuer("ES256")
    bound = signer.mint(
        "ann@example.com",
        issued_at=NOW,
        extra={ANSWER_CLAIM: {"chat": "chat-1", "calls": {"g1": "d1", "r1": "d2"}}},
    )
    verified = verify_token(bound, signer.trust_spec(), now=NOW)
    assert verified.binding == AnswerBinding(chat="chat-1", calls=(("g1", "d1"), ("r1", "d2")))
    assert verified.binding is not None
    assert verified.binding.digest_of("r1") == "d2" and verified.binding.digest_of("x") is None
    plain = verify_token(
        signer.mint("ann@example.com", issued_at=NOW), signer.trust_spec(), now=NOW
    )
    assert plain.binding is None


@pytest.mark.parametrize(
    "claim",
    [
        None,
        "chat-1",
        {"chat": "chat-1"},
        {"chat": "", "calls": {"g1": "d1"}},
        {"chat": "chat-1", "calls": {}},
        {"chat": "chat-1", "calls": {"g1": 7}},
        {"chat": "chat-1", "calls": [["g1", "d1"]]},
        {"chat": 1, "calls": {"g1": "d1"}},
    ],
)
def test_a_binding_that_cannot_be_read_refuses_the_token(claim: Any) -> None:
    """A token that says it is bound and cannot be read must not answer as if it were not."""
    signer = issuer("ES256")
    claims = claims_of(signer.mint("ann@example.com", issued_at=NOW))
    claims[ANSWER_CLAIM] = claim  # null too, which mint() would leave out
    token = sign_raw(
        json.dumps(claims).encode(),
        key=signer.private_key,
        alg="ES256",
        headers={"kid": signer.kid},
    )
    assert ANSWER_CLAIM in refusal(token, signer.trust_spec())


def test_a_token_bound_to_too_many_calls_is_refused() -> None:
    signer = issuer("ES256")
    calls = {f"c{i}": "d" for i in range(MAX_BOUND_CALLS + 1)}
    token = signer.mint(
        "ann@example.com", issued_at=NOW, extra={ANSWER_CLAIM: {"chat": "c", "calls": calls}}
    )
    assert f"at most {MAX_BOUND_CALLS}" in refusal(token, signer.trust_spec())


# ---------------------------------------------------------------------------------------------
# Whatever arrives, only IdentityError.

FUZZ_ISSUER = TokenIssuer("ES256", kid="k1")
FUZZ_TOKEN = FUZZ_ISSUER.mint("alice@corp.test", issued_at=NOW)


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(min_value=0, max_value=len(FUZZ_TOKEN) - 1),
    replacement=st.text(max_size=3),
)
def test_any_edit_of_a_token_is_refused_or_changes_nothing(position: int, replacement: str) -> None:
    edited = FUZZ_TOKEN[:position] + replacement + FUZZ_TOKEN[position + 1 :]
    try:
        verified: VerifiedIdentity | str = verify_token(edited, FUZZ_ISSUER.trust_spec(), now=NOW)
    except IdentityError as e:
        verified = e.reason
    if isinstance(verified, str):
        assert "\n" not in verified and edited not in verified
    else:
        # Only an edit that leaves the token as it was passes.
        assert edited == FUZZ_TOKEN and verified.identity == "alice@corp.test"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | st.from_regex(r"[A-Za-z0-9_=-]*\.[A-Za-z0-9_=-]*\.[A-Za-z0-9_=-]*"))
def test_arbitrary_text_is_refused_with_an_identity_error(text: str) -> None:
    with pytest.raises(IdentityError):
        verify_token(text, FUZZ_ISSUER.trust_spec(), now=NOW)
