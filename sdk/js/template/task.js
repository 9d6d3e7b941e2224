// {{name}}: a wasq task. Input {"name": "Ada"} -> output {"greeting": "Hello, Ada!"}.
import { task, step, log } from './wasq.js';

export const run = task(async (input) => {
  // A durable step: once it completed, a retry or resume reuses its stored result.
  const greeting = await step('greet', () => {
    log.info(`greeting ${input.name}`);
    return `Hello, ${input.name}!`;
  });
  return { greeting };
});
