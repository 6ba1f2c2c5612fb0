"""spec-auditor: statistical audits of LLM inference providers."""
