"""A knowledge corpus of 32 short policy documents of a fictional shop, and named queries
whose expected document must rank first: the ranking test of knowledge search.

The queries are asked the way a customer would ask, in their own words (plurals, other
verb forms, stop words), not copied from the documents."""

from __future__ import annotations

DOCUMENTS: dict[str, str] = {
    "refunds.md": """# Refund policy

Refunds are issued to the original payment method within 5 business days after we
receive the returned item. Store credit is refunded instantly.

## Partial refunds

Items returned without their original packaging receive a partial refund of 80 percent.
""",
    "returns.md": """# Returns

You can return most items within 30 days of delivery. Print the prepaid return label
from your order page and drop the parcel at any post office.

## Items that cannot be returned

Underwear, opened software and personalised engravings cannot be returned.
""",
    "shipping.md": """# Domestic shipping

Standard delivery takes 2 to 4 working days. Express delivery arrives the next working
day when ordered before 14:00. Shipping is free for orders above 50 euros.
""",
    "international-shipping.md": """# International shipping

We ship to 40 countries. Parcels to Canada, the United States and the United Kingdom
may be charged customs duties and import taxes by the destination country; these fees
are paid by the recipient on delivery.
""",
    "warranty.md": """# Warranty

Every product carries a two-year manufacturer warranty against defects. The warranty
does not cover accidental damage, water damage or normal wear.

## Making a warranty claim

Send a photo of the defect and your order number to warranty@shop.example.
""",
    "privacy.md": """# Privacy notice

We process personal data only to fulfil orders and provide support. We never sell
personal data to third parties. You may request a copy of your data at any time.
""",
    "password-reset.md": """# Resetting your password

Forgot your password? Click "Forgot password" on the sign-in page and we email you a
reset link. The link expires after 30 minutes; request a new one if it has expired.
""",
    "account-deletion.md": """# Deleting your account

To close and delete your account, open Settings, then Privacy, and choose "Delete
account". Deletion is permanent after a 14-day grace period during which you can
cancel it by signing in.
""",
    "two-factor.md": """# Two-factor authentication

Protect your account with two-factor authentication. After your password, enter the
six-digit code from your authenticator app. Lost your phone? Use one of the backup
codes we gave you when you enabled it.
""",
    "billing.md": """# Billing cycle

Subscriptions are billed monthly on the date you subscribed. Annual plans are billed
once a year with a 15 percent discount.
""",
    "invoices.md": """# Invoices and VAT

A VAT invoice is attached to every order confirmation email. Business customers can add
their VAT number at checkout so that the invoice shows it and reverse charge applies.
""",
    "gift-cards.md": """# Gift cards

Gift cards never expire and can be used for any purchase, including sale items. Gift
cards cannot be exchanged for cash. Check a card's balance on the gift card page.
""",
    "loyalty.md": """# Loyalty programme

Members earn one point per euro spent. 100 points give a 5 euro voucher. Points expire
24 months after they were earned.
""",
    "price-match.md": """# Price match guarantee

Found the same product cheaper at another retailer within 7 days of buying it? We match
the lower price and refund the difference. Marketplace sellers and auctions do not count.
""",
    "damaged-items.md": """# Damaged or broken items

If your order arrives damaged or broken, report it within 48 hours with photos of the
item and the box. We send a replacement at no cost, or a refund if none is in stock.
""",
    "order-cancellation.md": """# Cancelling an order

You can cancel an order free of charge until it ships. Once it has shipped, refuse the
delivery or return it as usual.
""",
    "subscriptions.md": """# Managing your subscription

Pause, upgrade or downgrade your subscription from the Account page. Downgrades take
effect at the end of the current billing period.
""",
    "student-discount.md": """# Student discount

Students get 10 percent off with a verified student email address. Verification is
valid for one academic year and must then be renewed.
""",
    "accessibility.md": """# Accessibility

Our website follows WCAG 2.2 AA. Screen reader users can reach support by phone, and
every product page offers a large-print description.
""",
    "data-retention.md": """# Data retention

Order records are kept for seven years to meet tax law. Support chat transcripts are
deleted after 12 months. Server logs are deleted after 30 days.
""",
    "cookies.md": """# Cookie policy

We use essential cookies for the shopping basket and sign-in, and analytics cookies
only with your consent. You can change your cookie preferences from the footer.
""",
    "security-incidents.md": """# Security incidents

If we detect a data breach, we notify affected customers and the supervisory authority
within 72 hours and publish a report on our status page.
""",
    "api-rate-limits.md": """# API rate limits

The partner API allows 600 requests per minute per API key. Exceeding the limit returns
HTTP 429 with a Retry-After header; back off and retry.
""",
    "sla.md": """# Service level agreement

Business plans guarantee 99.9 percent monthly uptime. If we miss it, you receive
service credits of 10 percent of the monthly fee for every additional hour of downtime.
""",
    "support-hours.md": """# Support hours

Customer support is available by chat and phone from 8:00 to 20:00 on weekdays and from
10:00 to 16:00 on Saturdays. Email is answered within one working day.
""",
    "escalation.md": """# Complaints and escalation

Not happy with an answer? Ask the agent to escalate your complaint to a team lead, who
replies within two working days. Unresolved complaints can go to the ombudsman.
""",
    "holidays.md": """# Holiday opening times

Stores and support close on 25 and 26 December and on 1 January. Orders placed during
the holidays ship on the next working day.
""",
    "store-pickup.md": """# Click and collect

Order online and collect in any of our 12 stores. Pickup orders are ready within two
hours and held for seven days; bring your order number and an ID.
""",
    "pre-orders.md": """# Pre-orders

Pre-ordered products are charged when they ship, not when you place the pre-order.
The release date shown is an estimate from the manufacturer.
""",
    "bulk-orders.md": """# Bulk and wholesale orders

Orders of 50 units or more qualify for wholesale pricing. Contact sales for a quote;
bulk orders ship on pallets within 10 working days.
""",
    "payment-methods.md": """# Payment methods

We accept credit cards, debit cards, PayPal, iDEAL and bank transfer. Pay later with
Klarna is available for orders up to 1000 euros.
""",
    "product-recalls.md": """# Product recalls

When a product is recalled for safety reasons we contact every buyer by email. Stop
using the product and return it for a full refund, even after the return period.
""",
}

# (query as a customer asks it, the document that must rank first)
QUERIES: list[tuple[str, str]] = [
    ("how many days until my money is refunded", "refunds.md"),
    ("can I return underwear I bought", "returns.md"),
    ("do I pay customs fees when you ship to Canada", "international-shipping.md"),
    ("I forgot my password and the reset link expired", "password-reset.md"),
    ("how do I delete my account permanently", "account-deletion.md"),
    ("lost my phone, authenticator codes for two-factor", "two-factor.md"),
    ("does my gift card expire", "gift-cards.md"),
    ("VAT number on the invoice for my business", "invoices.md"),
    ("my parcel arrived broken", "damaged-items.md"),
    ("found it cheaper at another retailer", "price-match.md"),
    ("how long do you keep chat transcripts", "data-retention.md"),
    ("API returned 429 too many requests", "api-rate-limits.md"),
    ("uptime guarantee and service credits", "sla.md"),
    ("when can I call customer support on Saturday", "support-hours.md"),
    ("collect my order in a store", "store-pickup.md"),
    ("when is a pre-order charged", "pre-orders.md"),
    ("can I pay later with Klarna", "payment-methods.md"),
    ("how do I make a warranty claim for a defect", "warranty.md"),
    ("escalate my complaint to the ombudsman", "escalation.md"),
    ("discount for students", "student-discount.md"),
]
