// Sends a welcome email through an HTTP email API, exactly once per run.
// Input {"email": "ada@example.com", "name": "Ada", "api": "https://api.mailer.example"}
// ("api" is optional) -> output {"email": ..., "messageId": ...}.
import { task, step, fetch, ensureOk, log, FatalError } from './wasq.js';

export const run = task(async (input) => {
  const { email, name = 'there', api = 'https://api.mailer.example' } = input ?? {};
  // Bad input fails the same way on every attempt: don't retry it.
  if (typeof email !== 'string' || !email.includes('@')) {
    throw new FatalError(`invalid email ${JSON.stringify(email)}`);
  }

  // The POST is a step: once it succeeded, a retry of this run does not send again. If the
  // worker dies mid-request the body may run twice: the Idempotency-Key header (the same
  // for every run of this step of this run) lets the email API drop the duplicate.
  const messageId = await step('send', async () => {
    log.info(`sending the welcome email to ${email}`);
    const response = await fetch(`${api}/v1/messages`, {
      method: 'POST',
      idempotent: true,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        to: email,
        subject: `Welcome, ${name}!`,
        text: `Hi ${name}, thanks for signing up.`,
      }),
    });
    // 5xx, 408 and 429 are retried (429/503 after their Retry-After); other 4xx are fatal.
    await ensureOk(response);
    return (await response.json()).id ?? null;
  });

  return { email, messageId };
});
