// The Vercel AI SDK as a client of formtax serve (issue 59; run by tests/serve/test_agents.py with node, after
// scripts/env-agents.sh ran `npm ci` here): generateObject with a zod schema, streamText with a tool and stopWhen,
// and tools together with Output.object. Usage: node ai_sdk.mjs BASE_URL; prints one JSON line per case.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, Output, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

// the recipe (docs/serve.md): formtax serve takes JSON Schemas, so say so (else the SDK only asks for json_object)
const formtax = createOpenAICompatible({
  name: "formtax", baseURL: process.argv[2], apiKey: "none", supportsStructuredOutputs: true,
});
const model = formtax.chatModel("default");
const add = tool({
  description: "Add two integers.",
  inputSchema: z.object({ a: z.number().int(), b: z.number().int() }),
  execute: async ({ a, b }) => `TOOL-RESULT ${a + b}`,
});
const Total = z.object({ total: z.number().int() });
const print = (obj) => console.log(JSON.stringify(obj));

const made = await generateObject({ model, schema: Total, prompt: "Tom has 3 apples and buys 4 more. How many?",
                                    maxOutputTokens: 60 });
print({ case: "generateObject", object: made.object, finishReason: made.finishReason });

const streamed = streamText({ model, tools: { add }, stopWhen: stepCountIs(3), prompt: "What is 3 plus 4?",
                              maxOutputTokens: 80 });
let text = "";
for await (const part of streamed.textStream) text += part;
const steps = await streamed.steps;
print({ case: "streamText", text, steps: steps.length,
        toolCalls: steps.flatMap((s) => s.toolCalls.map((c) => c.input)),
        toolResults: steps.flatMap((s) => s.toolResults.map((r) => r.output)) });

const both = await generateText({ model, tools: { add }, stopWhen: stepCountIs(3), output: Output.object({ schema: Total }),
                                  prompt: "What is 3 plus 4?", maxOutputTokens: 80 });
print({ case: "toolsWithOutput", output: both.output, steps: both.steps.length,
        toolCalls: both.steps.flatMap((s) => s.toolCalls.map((c) => c.input)) });
