"""LLM host patterns (``observer.hosts``): parsing, matching, and the built-in list.

Expected values are written by hand from the patterns' documented meaning and the vendors' API
base URLs (OpenAI, Azure OpenAI, Anthropic, Google AI / Vertex, AWS Bedrock regional endpoints,
Mistral, Cohere, Groq, OpenRouter, Together, Fireworks, DeepSeek, xAI, Perplexity API
references; Copilot, Cursor and Windsurf hosts from shared reference "binary-formats")."""

from __future__ import annotations

import pytest

from observer.hosts import DEFAULT_LLM_HOSTS, HostList, HostPattern, llm_hosts, parse_patterns


@pytest.mark.parametrize(
    ("text", "host", "port", "kind"),
    [
        ("api.openai.com", "api.openai.com", None, "exact"),
        ("API.OpenAI.com.", "api.openai.com", None, "exact"),
        ("*.openai.azure.com", "openai.azure.com", None, "suffix"),
        ("10.0.0.5:8000", "10.0.0.5", 8000, "exact"),
        ("[::1]:8000", "::1", 8000, "exact"),
        ("[2001:db8:0:0::1]", "2001:db8::1", None, "exact"),
        ("2001:db8::1", "2001:db8::1", None, "exact"),
        ("*-aiplatform.googleapis.com", "*-aiplatform.googleapis.com", None, "glob"),
        ("bedrock-runtime.*.amazonaws.com:443", "bedrock-runtime.*.amazonaws.com", 443, "glob"),
        ("*", "*", None, "any"),
        ("*:8443", "*", 8443, "any"),
    ],
)
def test_patterns_parse(text, host, port, kind):
    assert HostPattern.parse(text) == HostPattern(host, port, kind)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "an empty host pattern"),
        ("https://api.openai.com/v1", "not a URL"),
        ("user@host", "not a URL"),
        ("api.openai.com:0", "the port must be 1-65535"),
        ("api.openai.com:70000", "the port must be 1-65535"),
        ("api.openai.com:http", "the port must be 1-65535"),
        ("[::1", "an IPv6 address is written"),
        ("bad_host!.example", "is not a host name"),
        ("a..b", "is not a host name"),
        ("-a.example", "is not a host name"),
    ],
)
def test_bad_patterns_say_why(text, error):
    with pytest.raises(ValueError, match=error):
        HostPattern.parse(text)


def test_a_list_is_comma_or_space_separated_and_round_trips():
    patterns = parse_patterns(" api.openai.com, *.corp.example  10.0.0.5:8000,,[::1]:9 ")
    assert [str(p) for p in patterns] == ["api.openai.com", "*.corp.example", "10.0.0.5:8000", "[::1]:9"]


@pytest.mark.parametrize(
    ("patterns", "host", "port", "expected"),
    [
        ("api.openai.com", "api.openai.com", 443, True),
        ("api.openai.com", "API.OPENAI.COM.", 443, True),
        ("api.openai.com", "openai.com", 443, False),
        ("api.openai.com", "api.openai.com.evil.example", 443, False),
        ("*.openai.azure.com", "my-res.openai.azure.com", 443, True),
        ("*.openai.azure.com", "a.b.openai.azure.com", 443, True),
        ("*.openai.azure.com", "openai.azure.com", 443, False),
        ("*.openai.azure.com", "evilopenai.azure.com", 443, False),
        ("10.0.0.5:8000", "10.0.0.5", 8000, True),
        ("10.0.0.5:8000", "10.0.0.5", 8001, False),
        ("10.0.0.5:8000", "10.0.0.5", None, False),
        ("10.0.0.5", "10.0.0.5", None, True),
        ("[::1]:8000", "[::1]", 8000, True),
        ("[::1]:8000", "0:0:0:0:0:0:0:1", 8000, True),
        ("*-aiplatform.googleapis.com", "us-central1-aiplatform.googleapis.com", 443, True),
        ("*-aiplatform.googleapis.com", "x.us-central1-aiplatform.googleapis.com", 443, False),
        ("*-aiplatform.googleapis.com", "storage.googleapis.com", 443, False),
        ("bedrock-runtime.*.amazonaws.com", "bedrock-runtime.eu-central-1.amazonaws.com", 443, True),
        ("bedrock-runtime.*.amazonaws.com", "bedrock-runtime.a.b.amazonaws.com", 443, False),
        ("bedrock-runtime.*.amazonaws.com:443", "bedrock-runtime.us-east-1.amazonaws.com", 8443, False),
        ("*", "anything.example", 1, True),
        ("*:8443", "anything.example", 443, False),
        ("", "api.openai.com", 443, False),
    ],
)
def test_matching(patterns, host, port, expected):
    assert HostList(parse_patterns(patterns)).matches(host, port) is expected


VENDOR_HOSTS = [
    "api.openai.com",
    "contoso-eu.openai.azure.com",
    "contoso.cognitiveservices.azure.com",
    "contoso.services.ai.azure.com",
    "api.anthropic.com",
    "generativelanguage.googleapis.com",
    "aiplatform.googleapis.com",
    "europe-west4-aiplatform.googleapis.com",
    "bedrock-runtime.us-east-1.amazonaws.com",
    "bedrock-runtime-fips.us-gov-west-1.amazonaws.com",
    "api.mistral.ai",
    "api.cohere.com",
    "api.groq.com",
    "openrouter.ai",
    "api.together.xyz",
    "api.fireworks.ai",
    "api.deepseek.com",
    "api.x.ai",
    "api.perplexity.ai",
    "api.githubcopilot.com",
    "api.individual.githubcopilot.com",
    "copilot.microsoft.com",
    "api2.cursor.sh",
    "agent.api5.cursor.sh",
    "server.codeium.com",
    "inference.codeium.com",
]

NOT_LLM_HOSTS = [
    "www.bank.example",
    "storage.googleapis.com",
    "s3.amazonaws.com",
    "bedrock.us-east-1.amazonaws.com",  # the control plane (models, guardrails): no inference
    "openai.com",
    "chatgpt.com",
    "outlook.office.com",
    "substrate.office.com",  # all of Microsoft 365: the operator adds it knowingly
    "github.com",
]


@pytest.mark.parametrize("host", VENDOR_HOSTS)
def test_the_built_in_list_has_every_vendor_named_in_the_issue(host):
    assert llm_hosts(None, None).matches(host, 443)


@pytest.mark.parametrize("host", NOT_LLM_HOSTS)
def test_the_built_in_list_leaves_other_hosts_alone(host):
    assert not llm_hosts(None, None).matches(host, 443)


def test_llm_hosts_replaces_the_defaults_and_extra_adds_to_either():
    assert len(llm_hosts(None, None).patterns) == len(DEFAULT_LLM_HOSTS)
    own = llm_hosts("gateway.corp.example", None)
    assert own.matches("gateway.corp.example", 443) and not own.matches("api.openai.com", 443)
    both = llm_hosts(None, "gateway.corp.example,10.0.0.5:8000")
    assert both.matches("api.openai.com", 443) and both.matches("10.0.0.5", 8000)
    assert not both.matches("10.0.0.5", 80)
    assert not llm_hosts("", None)  # an empty list: only the draft's media type, in clear
