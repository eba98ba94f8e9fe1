"""Accounts: what belongs to a person rather than to one chat. linking.py and merge.py (`/link`, `/unlink`: identities
joined into one account), api_tokens.py (`/token`: bearer tokens), web_signin.py (`/web`: sign-in links and cookies),
own_data.py (`/export`, `/forget_me`) and usage.py (token usage, budgets, `/usage`, `/budget`). They do not import
one another."""
