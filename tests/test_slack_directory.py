"""Who is who in Slack (``SlackDirectory``), what a message may say (``mrkdwn``), and what the
conversation keeps of several posts: plain logic, no server."""

from __future__ import annotations

import pytest

from temporal_agent_interrupts.activities.slack import POSTED_BYTES, _decode, _encode, mrkdwn
from temporal_agent_interrupts.hosting import SlackChannel, SlackDirectory
from tests.slack_standin import TOKEN

DIRECTORY = SlackDirectory(
    users={"U01": "ann@example.com", "U02": "bob@example.com", "W03": "cy@example.com"},
    groups={"risk": ["bob@example.com", "cy@example.com", "nobody@example.com"]},
)


def test_approvers_and_groups_become_slack_users_once_each_in_order():
    found = DIRECTORY.slack_users(["group:risk", "ann@example.com", "bob@example.com", "x@y"])
    assert found == ["U02", "W03", "U01"]
    assert DIRECTORY.slack_users([]) == []


def test_a_click_maps_by_user_id_to_the_identity_and_its_groups():
    assert DIRECTORY.identity_of("U02") == "bob@example.com"
    assert DIRECTORY.identity_of("U99") is None
    assert DIRECTORY.groups_of("bob@example.com") == ("risk",)
    assert DIRECTORY.groups_of("ann@example.com") == ()


@pytest.mark.parametrize(
    ("users", "why"),
    [
        ({"ann": "ann@example.com"}, "not a Slack user id"),
        ({"U01": " "}, "empty"),
        ({"U01": "ann@example.com", "U02": "ann@example.com"}, "two Slack users"),
    ],
)
def test_a_directory_that_could_map_a_click_wrongly_is_refused(users, why):
    with pytest.raises(ValueError, match=why):
        SlackDirectory(users=users)


def test_mrkdwn_escapes_what_slack_would_read_as_a_mention_or_a_link():
    assert mrkdwn("<!channel> & <https://x|y>") == "&lt;!channel&gt; &amp; &lt;https://x|y&gt;"


def test_what_is_kept_of_many_posts_fits_and_says_some_were_left_out():
    posted = [f"D0USER{i:04d}:1796467828.{i:06d}" for i in range(12)]
    kept = _encode(posted)
    assert len(kept.encode()) <= POSTED_BYTES and kept.endswith(";+")
    refs, more = _decode(kept)
    assert more and refs and refs == [tuple(p.split(":")) for p in posted[: len(refs)]]
    assert _decode(_encode(posted[:1])) == ([tuple(posted[0].split(":"))], False)


def test_a_channel_never_shows_its_token():
    channel = SlackChannel(token=TOKEN, channel="C0APPROVALS")
    assert TOKEN not in repr(channel)
    with pytest.raises(ValueError, match="channel id"):
        SlackChannel(token=TOKEN, channel="#approvals")
    with pytest.raises(ValueError, match="channel="):
        SlackChannel(token=TOKEN)
