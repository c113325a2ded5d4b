"""A client written for ``vllm serve``'s structured outputs, in the form vLLM's documentation shows (the openai SDK
with vLLM's fields in ``extra_body``). tests/serve/test_vllm_fields.py runs it unchanged against ``formtax serve``:
the only input is the server's address (``OPENAI_BASE_URL``) and model name (``MODEL``)."""

import json
import os
import re

from openai import OpenAI
from pydantic import BaseModel

client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="EMPTY")
model = os.environ["MODEL"]


def ask(prompt: str, **extra_body) -> str:
    completion = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=80, extra_body=extra_body)
    return completion.choices[0].message.content


sentiment = ask("Classify this sentiment: vLLM is wonderful!", guided_choice=["positive", "negative"])
assert sentiment in ("positive", "negative"), sentiment


class CarDescription(BaseModel):
    brand: str
    model: str
    car_type: str


car = ask("Generate a JSON with the brand, model and car_type of the most iconic car from the 90's",
          guided_json=CarDescription.model_json_schema())
CarDescription.model_validate_json(car)

email = ask("Generate an example email address for Alan Turing, who works in Enigma. End in .com.",
            structured_outputs={"regex": r"[a-z0-9.]{1,20}@\w{6,10}\.com"}, top_k=5)
assert re.fullmatch(r"[a-z0-9.]{1,20}@\w{6,10}\.com", email), email

choice = ask("Is the sky blue?", structured_outputs={"choice": ["yes", "no"]}, top_k=-1, repetition_penalty=1.1)
assert choice in ("yes", "no"), choice

sql = ask("Write an SQL query to show the username from the users table.", guided_grammar="""
start: "SELECT " column " FROM " table
column: "username" | "email"
table: "users"
""")
assert sql in ("SELECT username FROM users", "SELECT email FROM users"), sql
print(json.dumps({"sentiment": sentiment, "car": json.loads(car), "email": email, "choice": choice, "sql": sql}))
